"""duplex: real-time full-duplex model serving over an OpenAI-Realtime-compatible WebSocket."""
