"""memproxy: a stateless OpenAI-compatible proxy that gives any chat client long-term memory."""

__version__ = "0.1.0"
