"""One Litestar Controller per resource of the ``/v1`` API."""
