"""Moved: the in-process gateway on simulated workers is ``maitred.harness.local``."""

raise ImportError("maitred.integrations.local moved to maitred.harness.local (from maitred.harness.local import local_cluster)")
