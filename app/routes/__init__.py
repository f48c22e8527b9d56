"""HTTP pages, the JSON API and the WebSocket."""
