"""SGLang as the gateway meets it: the HTTP client, the co-located launcher and the KV-event reader."""
