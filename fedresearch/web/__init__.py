"""Transport only: GPT-Researcher's WebSocket, Dify's /retrieval, the literature API, saved reports,
health and metrics. Each module speaks one protocol and hands typed requests to the floors below."""
