"""The ``http`` transport: FastAPI/uvicorn server over RLServer, httpx client."""
