"""HTTP frontend: the OpenAI-compatible FastAPI app over one AsyncLLM (see ``server.app.build_app``)."""
