"""``treadle serve``: one ASGI app (Starlette under uvicorn) on one port (issue 13).

Modules, each owning one concern (docs/serve.md):
- ``app``: ``create_app(ctx)`` composes every module's ``routes(ctx)``, CORS, the body
  limit and auth, and answers every error as JSON; ``Server`` runs it under uvicorn
  (the CLI's ``treadle serve`` and the tests' fixture).
- ``context``: ``ServeContext``, what every route reads (World, settings, client).
- ``settings``: the ``TREADLE_SERVE_*`` settings.
- ``auth``: bearer tokens (full and read-only roles) or a trusted proxy header.
- ``bodylimit``: 413 before an oversized body is read.
- ``http``: the JSON error shape, reading bodies and query parameters (400/422).
- ``api``: the JSON API's routes, from ``openapi.OPERATIONS``; handlers in ``runsapi``
  (reads), ``actions`` (cancel, wake, rerun, resume), ``stream`` (server-sent events);
  ``models`` the request and response bodies, ``views`` what a run's log shows.
- ``webhooks``: POST to a webhook URL resumes its hook (signatures, size limit).
- ``inspector``: the web page over the API (static files under ``inspector_static/``).
"""
