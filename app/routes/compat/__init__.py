"""`/v1/stream/{path}`: the reference server's URL shape."""

from app.routes.family import BuiltinFamily
from app.state_machine.machine import COMPAT_BUCKET

family = BuiltinFamily(COMPAT_BUCKET, "/v1/stream/")
