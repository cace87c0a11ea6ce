"""An OpenAI Agents SDK run (triage hands off to billing, billing calls a tool) through ``maitred serve``.

``MaitredTracingProcessor`` turns the SDK's spans into maitred events (model calls, the tool
call, the handoff) under the run's ``group_id``; ``MaitredRunHooks`` gives it the real
``tool_call_id``. The agents use the Chat Completions model pointed at the gateway, with the
program id in ``extra_body`` so the gateway schedules every step as one program.

    python examples/openai_agents/triage.py                        # starts two sim-workers and a gateway here
    python examples/openai_agents/triage.py --gateway http://127.0.0.1:8000   # an existing maitred serve
                                                                   # (its workers need --script-tools)
"""

import argparse
import asyncio
import contextlib
import json
import tempfile
import uuid

import httpx
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool, set_trace_processors
from openai import AsyncOpenAI

import maitred
from maitred.harness.local import local_cluster
from maitred.integrations.openai_agents import MaitredRunHooks, MaitredTracingProcessor


@function_tool
def lookup_order(order_id: str) -> str:
    """Find an order by its id."""
    return f"order {order_id}: shipped yesterday"


async def run(gateway: str) -> None:
    maitred.configure(runtime_url=gateway)
    program = f"conversation-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=f"{gateway}/v1", api_key="unused")
    model = OpenAIChatCompletionsModel(model="maitred-sim-worker", openai_client=client)
    settings = ModelSettings(max_tokens=32, extra_body={"program_id": program})
    billing = Agent(
        name="billing", instructions="Answer billing questions.", tools=[lookup_order], model=model, model_settings=settings
    )
    triage = Agent(name="triage", instructions="Route the customer.", handoffs=[billing], model=model, model_settings=settings)

    processor = MaitredTracingProcessor(record_model_calls=False)  # the gateway records the model calls
    set_trace_processors([processor])  # add_trace_processor(processor) keeps the vendor exporter too
    result = await Runner.run(
        triage,
        "Where is my order 17?",
        hooks=MaitredRunHooks(processor),
        run_config=RunConfig(group_id=program, workflow_name="support"),
    )
    maitred.flush(timeout=10)
    print("final output:", result.final_output)
    print("last agent:", result.last_agent.name)
    print("\nthe gateway's view of the program:")
    response = httpx.get(f"{gateway}/v1/programs/{program}")
    if response.status_code == 404:  # the trace's end sent program.end: only running programs are listed
        print(f"{program}: ended with its trace (program.end, framework openai-agents); see `maitred programs`")
        return
    info = response.json()
    print(
        json.dumps(
            {k: v for k, v in info.items() if k in ("program_id", "agent", "phase", "tier", "worker", "context_tokens")}, indent=2
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
        asyncio.run(run(gateway.rstrip("/")))


if __name__ == "__main__":
    main()
