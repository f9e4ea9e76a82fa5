"""REST API (Litestar) over the ledger's read models.

Not built yet: the ``ledger`` package already returns the exact JSON bodies the endpoints will serve
(see ``ledger.projections.queries``); ``api/app.py`` will wire them into ``create_app(settings)``.
"""
