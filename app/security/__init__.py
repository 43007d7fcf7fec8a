"""Who is calling and what they may do: opaque tokens, JWT access tokens, scopes per bucket, CORS.

`scopes` says what a principal holds, `tokens` and `jwt_tokens` turn a bearer token into one,
`authenticator` picks between them, and `policy` decides a request: allowed, 401, 403 or 404.
Routes call `policy.authorize` once, before the protocol core; no handler checks access itself.
"""
