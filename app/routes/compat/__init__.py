"""`/v1/stream/{path}`: the reference server's URL shape."""

from app.routes.family import builtin_bucket_routes
from app.state_machine.machine import COMPAT_BUCKET

routes = builtin_bucket_routes(COMPAT_BUCKET, "/v1/stream/")
