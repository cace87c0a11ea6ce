"""``maitred sim-worker``: the simulated SGLang server, driven by the engine model in ``maitred.sim.engine``."""
