"""Two LangGraph agents handing off (langgraph-swarm), served through ``maitred serve``.

``alice`` adds two numbers and hands over to ``bob``, who searches the code and answers. Both are
``create_agent`` graphs with ``MaitredMiddleware``: every tool call is recorded under the
model's tool call id, the handoff with the messages alice and bob share, and every model request
carries the program id (the LangGraph thread id) so the gateway schedules it as one program.
The gateway records the model calls itself, hence ``record_model_calls=False``.

    python examples/langgraph_swarm/swarm.py                       # starts two sim-workers and a gateway here
    python examples/langgraph_swarm/swarm.py --gateway http://127.0.0.1:8000   # an existing maitred serve
                                                                   # (its workers need --script-tools)
"""

import argparse
import contextlib
import json
import tempfile
import uuid

import httpx
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph_swarm import create_handoff_tool, create_swarm

import maitred
from maitred.harness.local import local_cluster
from maitred.integrations.langgraph import MaitredMiddleware


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def grep(pattern: str) -> str:
    """Search the code base for a pattern."""
    return f"cart.py:12: def {pattern}(self): ..."


def run(gateway: str) -> None:
    maitred.configure(runtime_url=gateway)

    def model() -> ChatOpenAI:
        return ChatOpenAI(base_url=f"{gateway}/v1", api_key="unused", model="maitred-sim-worker", max_tokens=32)

    alice = create_agent(
        model(),
        [add, create_handoff_tool(agent_name="bob")],
        name="alice",
        middleware=[MaitredMiddleware(record_model_calls=False)],
    )
    bob = create_agent(model(), [grep], name="bob", middleware=[MaitredMiddleware(record_model_calls=False)])
    app = create_swarm([alice, bob], default_active_agent="alice").compile()
    thread = f"swarm-{uuid.uuid4().hex[:8]}"
    result = app.invoke(
        {"messages": [{"role": "user", "content": "add 2 and 3, then let bob find the total"}]},
        {"configurable": {"thread_id": thread}},
    )
    maitred.flush(timeout=10)
    for message in result["messages"]:
        name = getattr(message, "name", None) or ""
        calls = [c["name"] for c in getattr(message, "tool_calls", [])]
        print(f"{message.type:>6} {name:<16} {calls or str(message.content)[:60]}")
    print("\nthe gateway's view of the program:")
    print(
        json.dumps(
            {
                k: v
                for k, v in httpx.get(f"{gateway}/v1/programs/{thread}").json().items()
                if k in ("program_id", "agent", "phase", "tier", "worker", "context_tokens", "idleness")
            },
            indent=2,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", help="URL of a running maitred serve (default: start one here on two sim-workers)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        gateway = args.gateway
        if gateway is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory())
            gateway = stack.enter_context(local_cluster(db_url=f"sqlite:///{folder}/maitred.db")).gateway_url
        run(gateway.rstrip("/"))


if __name__ == "__main__":
    main()
