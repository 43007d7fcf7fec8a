"""`/v1/stream/{path}`: the reference server's URL shape."""

from app.domain.paths import COMPAT_PREFIX
from app.routes.family import BuiltinFamily
from app.state_machine.machine import COMPAT_BUCKET

family = BuiltinFamily(COMPAT_BUCKET, COMPAT_PREFIX)
