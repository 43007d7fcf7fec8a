import httpx


def test_healthz(client: httpx.Client) -> None:
    assert client.get("/healthz").status_code == 200
