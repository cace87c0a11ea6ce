"""The live shell around the pure core: the HTTP app and proxy, the scheduler loop on the wall
clock, event ingest, metrics, the store writer and the SGLang client; everything that does I/O
or keeps time."""
