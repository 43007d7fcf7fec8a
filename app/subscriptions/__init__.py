"""Subscriptions (the protocol's `__ds/subscriptions`): webhook and pull-wake consumers.

So far this package holds the parts every node needs to agree on without the state machine: the
webhook signing key with its JWKS, and the rules a webhook URL must pass.
"""
