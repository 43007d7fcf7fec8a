"""The README's examples hold: its complete `rill.toml` loads, names every setting, and stays inside
the repository (no links to files outside it)."""

from __future__ import annotations

import re
from pathlib import Path

from app.config import Settings, load_settings

README = Path(__file__).resolve().parent.parent / "README.md"
# Settings the example leaves out on purpose: secrets (use the files), and TLS, which has its own section.
OMITTED = {"cluster_secret", "tls_cert", "tls_key", "tls_ca", "s3_region", "s3_path_style", "max_connections", "join"}
OMITTED |= {"unsafe_test_fault"}  # test only: `rill bench chaos --broken`, never in a config


def _example() -> str:
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.S)
    complete = [b for b in blocks if b.startswith("# rill.toml: rill serve --config rill.toml")]
    assert len(complete) == 1, "the README shows one complete rill.toml"
    return complete[0]


def test_the_complete_rill_toml_loads(tmp_path: Path) -> None:
    path = tmp_path / "rill.toml"
    path.write_text(_example())
    settings = load_settings(path)
    assert settings.forward_writes is True and settings.log_format == "text"
    assert settings.auth.mode == "on" and settings.bucket_quotas["acme"].max_streams == 10000


def test_the_complete_rill_toml_names_every_setting() -> None:
    text = _example()
    named = set(re.findall(r"^#? ?(\w+) =", text, flags=re.M)) | set(re.findall(r"^\[(\w+)", text, flags=re.M))
    missing = set(Settings.model_fields) - named - OMITTED
    assert not missing, f"the README's rill.toml does not show {sorted(missing)}"


def test_the_readme_points_only_inside_the_repository() -> None:
    text = README.read_text()
    assert "../shared" not in text and "](../" not in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith(("http://", "https://")):
            assert (README.parent / target).exists(), target
