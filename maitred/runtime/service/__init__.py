"""The I/O shell around the pure runtime core: gateway, scheduler loop, worker backends, metrics; everything here does I/O or keeps time."""
