"""``treadle serve``: one ASGI app (Starlette under uvicorn) on one port (issue 13).

Modules, each owning one concern and offering ``routes(ctx)``:
- ``app``: ``create_app(ctx)`` composes every module's routes, the auth middleware
  and CORS; ``serve(...)`` runs it under uvicorn (the CLI's ``treadle serve``).
- ``context``: ``ServeContext``, what every route reads (World, settings, client).
- ``auth``: bearer token or a trusted proxy header, the read-only role.
- ``api``: the JSON API (runs, events, actions, hooks, deployments), OpenAPI, SSE.
- ``webhooks``: POST to a webhook URL resumes its hook (signatures, size limit).
- ``inspector``: the web page over the API (static files under ``inspector_static/``).
"""
