"""The connection layer: accepting connections fairly, the HTTP protocol and its clocks, and the gate every request
passes (telemetry, tracing, API key, body limits) before its endpoint; it imports nothing of the request layer."""
