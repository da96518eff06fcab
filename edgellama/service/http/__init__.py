"""HTTP/1.1 on the service's socket (and optionally TCP): llama-server's and OpenAI's endpoints, so
existing clients work unchanged. h11 does all HTTP parsing; nothing here parses HTTP by hand.

connection (one h11 connection per client: limits, timeouts, keep-alive, key check), fields (HTTP
bodies -> protocol v1 request objects, results -> llama-server / OpenAI shapes), llama_routes,
openai_routes. Requests become the same protocol v1 requests the JSON-lines path submits; nothing here
schedules work itself.
"""
