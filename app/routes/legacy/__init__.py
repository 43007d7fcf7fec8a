"""`/streams/{id}`: the legacy URL shape."""

from app.domain.paths import LEGACY_PREFIX
from app.routes.family import BuiltinFamily
from app.state_machine.machine import LEGACY_BUCKET

family = BuiltinFamily(LEGACY_BUCKET, LEGACY_PREFIX)
