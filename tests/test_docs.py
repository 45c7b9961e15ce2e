"""The documentation site: it builds in strict mode, and its generated parts cannot drift from the code.

- `mkdocs build --strict` of the real site (mkdocs.yml) succeeds; strict mode
  plus `validation: anchors: warn` turn every broken page link, #anchor and
  `::: identifier` into a failure, and a deliberately broken copy shows it.
- The API reference is rendered from the docstrings at build time; every
  public name of `hasten` must appear in it (its object inventory).
- docs/cli.md is generated from the argument parser by
  scripts/gen_cli_reference.py; `--check` fails when they differ, as a
  deliberately modified copy and a deliberately extended parser show.
- The Accelerate config file shown on the "Coming from Accelerate" page
  loads with hasten's config reader.

The doc build dependencies are in the `test` (and `docs`) extra.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "scripts" / "gen_cli_reference.py"
BUILD_TIMEOUT = 120

if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings_handlers") is None:
    pytest.fail("the documentation tests need mkdocs and mkdocstrings[python]: pip install -e '.[docs]'",
                pytrace=False)


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `config` into `site`, run from the repository root (as in CI and by hand)."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT)


def inventory(site: Path) -> set[str]:
    """Names in the site's object inventory (objects.inv, Sphinx format), i.e. every documented object."""
    *header, body = (site / "objects.inv").read_bytes().split(b"\n", 4)
    assert header[0] == b"# Sphinx inventory version 2"
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = mkdocs_build(ROOT / "mkdocs.yml", out)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


# ---------------------------------------------------------------------------- the site
def test_site_builds_in_strict_mode(site):
    for page in ("index.html", "concepts/topology/index.html", "concepts/data/index.html", "multi-node/index.html",
                 "coming-from-accelerate/index.html", "troubleshooting/index.html", "cli/index.html",
                 "api/accelerator/index.html"):
        assert (site / page).is_file(), page


def test_api_pages_are_rendered_from_the_docstrings(site):
    page = (site / "api" / "accelerator" / "index.html").read_text()
    # methods the Accelerator takes from its mixins are on its page too
    for method in ("prepare", "backward", "accumulate", "save_state", "load_state", "gather_for_metrics", "init_trackers"):
        assert f'id="hasten.accelerator.Accelerator.{method}"' in page, method
    # a docstring's example is rendered as code, not as Markdown (see scripts/griffe_hasten.py)
    assert "Examples:" in page and '<span class="gp">&gt;&gt;&gt; </span>' in page
    assert "<blockquote>" not in page


def test_every_public_name_is_in_the_api_reference(site):
    import hasten

    documented = inventory(site)
    missing = [name for name in hasten.__all__ if name != "__version__"
               and not any(entry.endswith(f".{name}") for entry in documented)]
    assert not missing, f"public names without an API reference entry (add them to a docs/api/*.md page): {missing}"


def test_cli_page_is_rendered(site):
    page = (site / "cli" / "index.html").read_text()
    for anchor in ("hasten-launch", "hasten-config-default", "hasten-estimate-memory"):
        assert f'id="{anchor}"' in page, anchor
    assert "--num_processes_per_machine" in page


def _broken_site(tmp_path: Path, pages: dict[str, str]) -> Path:
    """A copy of mkdocs.yml over a docs folder holding only `pages` (paths made absolute)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    for name, text in pages.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(text)
    config["docs_dir"] = str(docs)
    config["nav"] = [{name.removesuffix(".md"): name} for name in pages]
    python = next(p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    python["handlers"]["python"]["paths"] = [str(ROOT / "src")]
    options = python["handlers"]["python"]["options"]  # relative paths there are relative to the config file
    options["extensions"] = [str(ROOT / extension) for extension in options.get("extensions", [])]
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    config = _broken_site(tmp_path, {
        "index.md": "# Home\n\nSee [the recipes](multi-node.md) and [a section](#no-such-section).\n",
    })
    result = mkdocs_build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "multi-node.md" in result.stderr and "no-such-section" in result.stderr, result.stderr


def test_a_broken_api_reference_fails_the_build(tmp_path):
    config = _broken_site(tmp_path, {
        "index.md": "# Home\n",
        "api.md": "# API\n\n::: hasten.accelerator.NoSuchThing\n",
    })
    result = mkdocs_build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "hasten.accelerator.NoSuchThing" in result.stdout + result.stderr


# ---------------------------------------------------------------------------- the CLI reference
def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_reference", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_matches_the_parser():
    result = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"docs/cli.md is stale; run: python scripts/gen_cli_reference.py\n{result.stdout}"


def test_the_check_fails_on_an_edited_page(tmp_path):
    edited = tmp_path / "cli.md"
    text = (ROOT / "docs" / "cli.md").read_text()
    assert "processes in total, across all machines" in text
    edited.write_text(text.replace("processes in total, across all machines", "processes per machine"))
    result = subprocess.run([sys.executable, str(GENERATOR), "--check", "--output", str(edited)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "-| `--num_processes`" in result.stdout and "out of date" in result.stderr


def test_the_check_fails_when_the_parser_changes():
    generator = _generator()
    parser = generator.build_parser()
    launch = next(a for a in parser._actions if a.dest == "command").choices["launch"]
    launch.add_argument("--brand_new_flag", help="a flag the page does not know yet")
    rendered = generator.render(parser)
    assert "`--brand_new_flag`" in rendered and "a flag the page does not know yet" in rendered
    assert rendered != (ROOT / "docs" / "cli.md").read_text()


def test_cli_reference_does_not_depend_on_this_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("HASTEN_CONFIG_FILE", str(tmp_path / "elsewhere.yaml"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    text = _generator().render()
    assert str(tmp_path) not in text and "~/.config/hasten/default_config.yaml" in text


# ---------------------------------------------------------------------------- page content that the code must honour
def test_the_accelerate_config_on_the_page_loads(tmp_path):
    from hasten.launch.config import load_config

    page = (ROOT / "docs" / "coming-from-accelerate.md").read_text()
    block = re.search(r"<!-- tested: accelerate-yaml -->\s*\n```yaml\n(.*?)\n```", page, re.DOTALL).group(1)
    path = tmp_path / "default_config.yaml"
    path.write_text(block)
    config = load_config(path)
    assert (config.distributed_type, config.num_processes, config.mixed_precision) == ("MULTI_GPU", 4, "bf16")
