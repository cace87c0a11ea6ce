"""The scheduling policies by name (the names of ``--policy``), one small module each."""

from collections.abc import Callable

from maitred.runtime.policies.base import Policy
from maitred.runtime.policies.cache_aware import CacheAware
from maitred.runtime.policies.maitred import Maitred
from maitred.runtime.policies.mori import Mori
from maitred.runtime.policies.round_robin import RoundRobin
from maitred.runtime.policies.tao import Tao
from maitred.runtime.policies.thunderagent import ThunderAgent

POLICIES: dict[str, Callable[[], Policy]] = {
    "maitred": Maitred,
    "mori": Mori,
    "tao": Tao,
    "thunderagent": ThunderAgent,
    "cache_aware": CacheAware,
    "round_robin": RoundRobin,
}


def make_policy(name: str) -> Policy:
    """A fresh policy instance; unknown names are refused with the list of known ones."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}") from None


__all__ = ["POLICIES", "CacheAware", "Maitred", "Mori", "Policy", "RoundRobin", "Tao", "ThunderAgent", "make_policy"]
