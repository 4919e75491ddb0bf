"""What a user takes away, against adversarial profile values: the winner's launch command pasted whole into a shell
runs exactly the recorded argv and nothing else; a secret read from the caller's environment never lands in results
or output; the report's chart data cannot close or hold open its <script> element; a profile that would put a
secret or a shell word where tunectl writes it is one line (exit 2)."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.profiles import fast_default
from tunectl.engines import engine
from tunectl.profile import load_profile

SECRET = "aDvSeCrEt-7f3e"                         # MY_CRED: ${ADV_SECRET}: the name does not say secret
ENV_VALUE = "a b $(touch {mark}/env) `touch {mark}/env2`\nsecond line 'q' \"dq\" ü"
HF_HOME = "${{HOME}}/hf 'x' $(touch {mark}/tpl)"        # read from the caller's environment, not a secret
TEMPLATE = "--sim-card x </script><script>alert(1)</script> {{{{x}}}} $(touch {mark}/flag)"


def tunectl(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunectl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200", "ADV_SECRET": SECRET, **(env or {})})


def adversarial_profile(tmp: Path, mark: Path) -> Path:
    """The embedded default with values a shell would act on: a server.python path with spaces, a model path with
    `$(...)`, backticks, quotes and unicode, a served name that starts with a dash and spans lines, a flag value that
    reads like the stand-in's own option, an env value that spans lines, and a secret from the environment."""
    path, _ = fast_default(tmp)
    data = yaml.safe_load(path.read_text())
    py_dir = tmp / "my py" / "bin"
    py_dir.mkdir(parents=True)
    (py_dir / "python3").symlink_to(sys.executable)
    data["model"]["path"] = f"zai-org/GLM 5 $(touch {mark}/model) `touch {mark}/model2` 'q' \"dq\" ünï"
    data["model"]["served_name"] = "-dash\nnewline $HOME"
    data["server"]["python"] = str(py_dir / "python3")
    data["server"]["flags"]["chat-template"] = TEMPLATE.format(mark=mark)
    data["server"]["env"] = {"FOO": ENV_VALUE.format(mark=mark), "MY_CRED": "${ADV_SECRET}",
                             "HF_HOME": HF_HOME.format(mark=mark)}
    data["bench"]["levels"] = [4]
    adv = tmp / "adv.yaml"
    adv.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return adv


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real stand-in sweep on the adversarial profile, and what a user takes away from it."""
    tmp = tmp_path_factory.mktemp("adv")
    mark = tmp / "marks"
    mark.mkdir()
    prof = adversarial_profile(tmp, mark)
    results = tmp / "results"
    res = tunectl(tmp, "sweep", "-p", str(prof), "-c", "4", "--study", "adv", "--results", str(results))
    assert res.returncode == 0, res.stdout + res.stderr
    out = {"tmp": tmp, "mark": mark, "profile": prof, "results": results, "sweep": res.stdout + res.stderr}
    for fmt in ("command", "json", "yaml"):
        got = tunectl(tmp, "best", "--study", "adv", "--results", str(results), "--format", fmt)
        assert got.returncode == 0, got.stderr
        out[fmt] = got.stdout
    page = tmp / "report.html"
    assert tunectl(tmp, "report", "--study", "adv", "--results", str(results), "--out", str(page)).returncode == 0
    out["html"] = page.read_text()
    out["launch"] = json.loads((results / "adv" / "trials" / "0" / "launch.json").read_text())
    return out


def _pasted(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The whole `best --format command` output pasted into bash, `python3` standing for a harmless printer of its
    argv and of FOO as it got it."""
    shim = ("python3() { printf 'ARG<%s>\\n' \"$@\"; printf 'FOO<%s>\\n' \"$FOO\"; "
            "printf 'HF_HOME<%s>\\n' \"$HF_HOME\"; }\n")
    return subprocess.run(["bash", "-c", shim + command], cwd=cwd, capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "HOME": str(cwd)})


def test_the_pasted_launch_command_runs_only_the_recorded_argv(swept: dict[str, Any]) -> None:
    ran = _pasted(swept["command"], swept["tmp"])
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    assert sorted(p.name for p in swept["mark"].iterdir()) == []          # nothing in a value, nor a `#` line, ran
    args = re.findall(r"ARG<(.*?)>\n", ran.stdout, re.S)
    foo = re.findall(r"FOO<(.*?)>\n", ran.stdout, re.S)
    prof = load_profile(swept["profile"])
    stand_in = swept["launch"]["argv"]
    tail = engine(prof).launch_args(prof)                                   # the stand-in's own options, at the end
    assert stand_in[-len(tail):] == tail
    assert args == ["-m", "sglang.launch_server", *stand_in[3:-len(tail)]]
    assert foo == [prof.server.env["FOO"]]
    # a value the profile reads from the caller's environment: as the profile wrote it, expanded where pasted
    hf_home = HF_HOME.format(mark=swept["mark"]).replace("${HOME}", str(swept["tmp"]))
    assert re.findall(r"HF_HOME<(.*?)>\n", ran.stdout, re.S) == [hf_home]
    config = yaml.safe_load((swept["results"] / "adv" / "trials" / "0" / "config.yaml").read_text())
    i = args.index("--chat-template")
    assert args[i + 1] == config["chat-template"] == prof.server.flags["chat-template"]   # the config file's value
    assert args[args.index("--model-path") + 1] == config["model-path"] == prof.model.path


def test_every_command_line_of_the_output_is_one_shell_line_or_a_comment(swept: dict[str, Any]) -> None:
    """A `#` line whose value spans lines (a quoted newline) keeps `# ` on each line it spans; the stand-in's own
    command in it, uncommented, is the stored argv."""
    comment = [ln for ln in swept["command"].splitlines() if "the stand-in itself" in ln]
    assert len(comment) == 1
    start = swept["command"].splitlines().index(comment[0])
    block = []
    for ln in swept["command"].splitlines()[start:]:
        if not ln.startswith("#"):
            break
        block.append(ln)
    text = "\n".join(x[2:] for x in block).split(": ", 1)[1]
    words = shlex.split(text)
    argv = words[next(i for i, w in enumerate(words) if "=" not in w):]
    assert argv == swept["launch"]["argv"]


def test_a_secret_read_from_the_callers_environment_is_never_stored_or_shown(swept: dict[str, Any]) -> None:
    for what in ("sweep", "command", "json", "yaml", "html"):
        assert SECRET not in swept[what], what
    for path in swept["results"].rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert 'MY_CRED="${ADV_SECRET}"' in swept["command"]      # the profile's own reference to the caller's environment
    dry = tunectl(swept["tmp"], "sweep", "--dry-run", "-p", str(swept["profile"]), "-c", "4")
    dry_json = tunectl(swept["tmp"], "sweep", "--dry-run", "--json", "-p", str(swept["profile"]), "-c", "4")
    assert dry.returncode == dry_json.returncode == 0
    assert SECRET not in dry.stdout + dry_json.stdout


def test_best_json_and_yaml_parse_back_with_the_tables_number(swept: dict[str, Any]) -> None:
    doc = json.loads(swept["json"])
    assert doc["study"] == "adv" and doc["argv"] == swept["launch"]["argv"]
    assert yaml.safe_load(swept["yaml"])["chat-template"] == doc["config"]["chat-template"]
    shown = f"{doc['confirmed']['value']:,.1f}"
    assert shown in swept["command"].splitlines()[0]


def _json_blocks(page: str) -> list[str]:
    return re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S)


def test_report_chart_data_cannot_close_or_hold_open_its_script(tmp_path: Path) -> None:
    """Knob values with `</script>`, `<!--` and `<script` (which together keep a script element open past its end
    tag: the charts then never draw) reach the charts' JSON as data only: no `<` in it, and it parses back."""
    prof = yaml.safe_load(fast_default(tmp_path)[0].read_text())
    choices = ["</script><script>console.error('XSS1')</script>", "<img src=x onerror=console.error('XSS2')>",
               "<!-- {{7*7}} ü", "plain"]
    prof["search"]["space"] = {"chat-template": {"type": "categorical", "choices": choices, "default": "plain"}}
    prof["search"]["finalists"] = {"reruns": 1, "budget": 2}
    path = tmp_path / "xss.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False, allow_unicode=True))
    results = tmp_path / "results"
    assert tunectl(tmp_path, "search", "--virtual", "--trials", "8", "-p", str(path), "--study", "xss",
                   "--results", str(results)).returncode == 0
    page = tmp_path / "report.html"
    assert tunectl(tmp_path, "report", "--study", "xss", "--results", str(results), "--out", str(page)).returncode == 0
    html = page.read_text()
    blocks = _json_blocks(html)
    assert len(blocks) >= 3 and all("<" not in b for b in blocks)
    seen = json.dumps([json.loads(b) for b in blocks], ensure_ascii=False)
    assert all(c in seen for c in choices[:3])                              # the values are there, as data
    assert html.count("<script") == html.count("</script>")


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["search"]["space"].update({"api-key": {"type": "categorical", "choices": ["k1", "k2"]}}),
     ["search.space.api-key", "secret", "server.env"]),
    (lambda d: d["search"]["space"].update({"key": {"type": "categorical", "choices": ["k1"], "flag": "api_key"}}),
     ["search.space.key", "secret"]),
    (lambda d: d["server"]["flags"].update({"--api-key": "abc"}), ["server.flags.--api-key", "server.env"]),
    (lambda d: d["server"].update({"env": {"X=$(touch pwned) Y": "v"}}), ["server.env", "X=$(touch pwned) Y",
                                                                         "letters, digits and '_'"]),
    (lambda d: d["search"]["space"].update({"x": {"type": "categorical", "choices": ["1"], "env": "A B"}}),
     ["search.space.x", "'A B'", "letters, digits and '_'"]),
])
def test_a_secret_or_a_shell_word_in_a_profile_is_one_line(tmp_path: Path, edit: Any, words: list[str]) -> None:
    path, _ = fast_default(tmp_path)
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = tunectl(tmp_path, "sweep", "--dry-run", "-p", str(path), "-c", "4")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and str(path) in res.stderr, res.stderr
    for w in words:
        assert w in res.stderr, (w, res.stderr)
    assert "k1" not in res.stdout and not (tmp_path / "pwned").exists()
