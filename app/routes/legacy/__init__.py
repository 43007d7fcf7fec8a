"""`/streams/{id}`: the legacy URL shape."""

from app.routes.family import builtin_bucket_routes
from app.state_machine.machine import LEGACY_BUCKET

routes = builtin_bucket_routes(LEGACY_BUCKET, "/streams/")
