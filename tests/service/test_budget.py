"""The body budget: request bodies held at once, all requests together."""

from __future__ import annotations

import pytest

from app.domain.errors import ProtocolError
from app.service.budget import BodyBudget


def test_the_budget_refuses_past_its_total_and_counts_what_is_given_back() -> None:
    budget = BodyBudget(10)
    assert budget.take(6) == 6
    with pytest.raises(ProtocolError) as exc:
        budget.take(5)
    assert getattr(exc.value, "status", None) == 503
    budget.give_back(6)
    assert budget.take(10) == 10
