"""The HTTP kit of core: the only core code that imports fastapi, starlette, uvicorn or httpx.

``common`` (JSON, error and body plumbing, the httpx pool), ``serve`` (bind, token rule,
``serve_http``), ``guards`` (token and body-size guards), ``openapi`` (the document hook).
Each imports its web library inside the functions that need it; plugins reach this package
only through ``arctic_platform.rl.api``.
"""
