"""The runtime's pure core (program state, signals, policies, scheduler) and, later, its shell."""

from maitred.runtime.decisions import Assignment, Decision, TierMove, Warmup
from maitred.runtime.policies import POLICIES, make_policy
from maitred.runtime.records import OpenTool, Phase, ProgramState, SignalConfig, Tier, WorkerState
from maitred.runtime.scheduler import Scheduler
from maitred.runtime.state import RuntimeState, View

__all__ = [
    "POLICIES",
    "Assignment",
    "Decision",
    "OpenTool",
    "Phase",
    "ProgramState",
    "RuntimeState",
    "Scheduler",
    "SignalConfig",
    "Tier",
    "TierMove",
    "View",
    "Warmup",
    "WorkerState",
    "make_policy",
]
