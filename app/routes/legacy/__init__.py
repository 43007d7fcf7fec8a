"""`/streams/{id}`: the legacy URL shape."""

from app.routes.family import BuiltinFamily
from app.state_machine.machine import LEGACY_BUCKET

family = BuiltinFamily(LEGACY_BUCKET, "/streams/")
