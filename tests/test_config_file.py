"""``maitred serve`` and ``maitred sim-worker`` settings from ``MAITRED_*`` variables and from
``--config FILE`` (YAML, TOML), on the real ``maitred`` parser: precedence (command line >
environment > file > default), refusals naming the key and the file, ``--worker-urls``,
``--print-config``, and one real ``maitred serve --config`` answering ``/healthz``."""

import argparse
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from maitred.cli import build_parser, main
from maitred.config_file import ConfigError, resolve
from maitred.gateway.serve import _config
from maitred.harness.background import free_port, wait_http
from maitred.sim.worker.server import config_from_args

A, B, C = "http://127.0.0.1:30001", "http://127.0.0.1:30002", "http://127.0.0.1:30003"


def settings(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    """What the command would run with: the real parser, then the environment and the file."""
    return resolve(build_parser().parse_args(argv), environ=env or {})


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_nothing_set_gives_the_flags_defaults_as_argparse_would():
    args = settings(["serve"])
    plain = argparse.ArgumentParser()
    from maitred.gateway.serve import add_arguments

    add_arguments(plain)
    expected = vars(plain.parse_args([]))
    assert {k: getattr(args, k) for k in expected} == expected
    assert args.warmup_prompt_mb == 4 << 20 and args.gpus == ("0",) and args.worker == []
    assert set(args.config_sources.values()) == {"default"}


def test_every_flag_from_the_environment_through_its_own_type():
    env = {
        "MAITRED_PORT": "9001",
        "MAITRED_WORKER": f"{A} {B}",
        "MAITRED_POLICY": "round_robin",
        "MAITRED_NO_DB": "true",
        "MAITRED_HOLD_TIMEOUT": "12.5",
        "MAITRED_MAX_BODY_MB": "8",
        "MAITRED_GPUS": "0,1",
        "MAITRED_TICK": "",  # empty: unset
    }
    args = settings(["serve"], env)
    assert (args.port, args.worker, args.policy, args.no_db, args.hold_timeout) == (9001, [A, B], "round_robin", True, 12.5)
    assert args.max_body_mb == 8 << 20 and args.gpus == ("0", "1") and args.tick is None
    assert args.config_sources["port"] == "$MAITRED_PORT" and args.config_sources["tick"] == "default"


def test_yaml_and_toml_files_give_the_same_settings(tmp_path):
    yaml_file = write(
        tmp_path,
        "maitred.yaml",
        f"port: 9002\nworker:\n  - {A}\n  - {B}\nno-db: true\nhold_timeout: 30\nforward-unknown-fields: yes\n",
    )
    toml_file = write(
        tmp_path,
        "maitred.toml",
        f'port = 9002\nworker = ["{A}", "{B}"]\nno-db = true\nhold_timeout = 30\nforward-unknown-fields = true\n',
    )
    for path in (yaml_file, toml_file):
        args = settings(["serve", "--config", path])
        assert (args.port, args.worker, args.no_db, args.hold_timeout, args.forward_unknown_fields) == (
            9002,
            [A, B],
            True,
            30.0,
            True,
        )
        assert args.config_sources["port"] == f"{path}: port"


def test_command_line_beats_environment_beats_file_beats_default(tmp_path):
    path = write(tmp_path, "c.yaml", f"port: 9001\nworker: [{A}, {B}]\npolicy: mori\n")
    env = {"MAITRED_PORT": "9002", "MAITRED_CONFIG": path}
    assert settings(["serve", "--port", "9003"], env).port == 9003
    assert settings(["serve"], env).port == 9002
    assert settings(["serve"], {"MAITRED_CONFIG": path}).port == 9001
    assert settings(["serve"]).port == 8000
    # a list set higher up replaces the lower one instead of adding to it
    assert settings(["serve", "--worker", C], env).worker == [C]
    assert settings(["serve"], env | {"MAITRED_WORKER": C}).worker == [C]
    assert settings(["serve"], env).worker == [A, B]
    # --config on the command line wins over $MAITRED_CONFIG
    other = write(tmp_path, "d.yaml", "policy: tao\n")
    assert settings(["serve", "--config", other], {"MAITRED_CONFIG": path}).policy == "tao"


def test_unknown_key_is_one_line_naming_the_key_and_the_file(tmp_path, capsys):
    path = write(tmp_path, "c.yaml", "port: 9001\nworkers: http://127.0.0.1:1\n")
    assert main(["serve", "--config", path]) == 2
    err = capsys.readouterr().err
    assert err == f"maitred: error: {path}: unknown key 'workers': maitred serve has no --workers; did you mean 'worker'?\n"


def test_bad_value_names_the_key_and_says_what_the_flag_says(tmp_path, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--port", "70000"])
    flag_error = capsys.readouterr().err
    path = write(tmp_path, "c.toml", "port = 70000\n")
    assert main(["serve", "--config", path]) == 2
    err = capsys.readouterr().err
    assert err == f"maitred: error: {path}: port: must be between 1 and 65,535, got 70000\n"
    assert "must be between 1 and 65,535, got 70000" in flag_error  # the flag's own validator, not a copy


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MAITRED_POLICY": "fastest"}, "$MAITRED_POLICY: invalid choice 'fastest' (choose from maitred, mori"),
        ({"MAITRED_NO_DB": "maybe"}, "$MAITRED_NO_DB: must be true or false, got 'maybe'"),
        ({"MAITRED_WORKER": "ftp://x"}, "$MAITRED_WORKER: 'ftp://x' is not a worker base URL"),
        ({"MAITRED_BUSY_MARGIN": "2"}, "$MAITRED_BUSY_MARGIN: must be in (0, 1], got '2'"),
    ],
)
def test_bad_environment_value_names_the_variable(env, message):
    with pytest.raises(ConfigError) as refused:
        settings(["serve"], env)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port: [1, 2]\n", "port: takes one value (a string or a number), got [1, 2]"),
        ("no-db: 2\n", "no-db: must be true or false, got 2"),
        ("- port\n", "must hold a mapping of settings (key: value), got a list"),
        ("port: 1\nport 2\n", "not valid YAML at line 3"),
        ("worker: [http://a:1]\nworker-urls: [http://a:1]\nport: 1\nport: 2\n", None),
    ],
)
def test_bad_file_content_names_the_file(tmp_path, text, message):
    path = write(tmp_path, "c.yaml", text)
    if message is None:  # duplicate YAML keys: the last wins, as in YAML; two spellings of a list add up
        args = settings(["serve", "--config", path])
        assert args.port == 2 and args.worker == ["http://a:1", "http://a:1"]
        return
    with pytest.raises(ConfigError) as refused:
        settings(["serve", "--config", path])
    assert str(refused.value).startswith(f"{path}: ") and message in str(refused.value)


def test_missing_or_unsupported_config_file_names_the_flag(tmp_path):
    with pytest.raises(ConfigError, match=r"^--config .*nope.yaml: cannot read \(No such file or directory\)$"):
        settings(["serve", "--config", str(tmp_path / "nope.yaml")])
    with pytest.raises(ConfigError, match=r"^--config .*c.ini: name a .yaml, .yml or .toml file$"):
        settings(["serve", "--config", write(tmp_path, "c.ini", "port=1")])


def test_worker_urls_takes_several_urls_as_sglang_router_does(tmp_path, capsys):
    args = settings(["serve", "--worker-urls", A, B, "--worker", C])
    assert args.worker == [A, B, C]
    assert settings(["serve"], {"MAITRED_WORKER_URLS": f"{A} {B}"}).worker == [A, B]
    path = write(tmp_path, "c.yaml", f"worker-urls: [{A}, {B}]\n")
    assert settings(["serve", "--config", path]).worker == [A, B]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--worker-urls", A, "not-a-url"])
    assert "argument --worker-urls: 'not-a-url' is not a worker base URL" in capsys.readouterr().err


def test_existing_variables_keep_working(tmp_path):
    db = f"sqlite:///{tmp_path / 'x.db'}"
    args = settings(["serve"], {"MAITRED_DB": db, "MAITRED_TOKEN": "t" * 20})
    cfg = _config(args, args.worker)
    assert cfg.db_url == db and cfg.tokens.required
    # --no-db wins over a database from the environment (MAITRED_DB is also the instrumentation's)
    args = settings(["serve", "--no-db"], {"MAITRED_DB": db})
    assert _config(args, args.worker).db_url is None
    # a short token from the environment is refused naming the variable
    args = settings(["serve"], {"MAITRED_TOKEN": "short"})
    with pytest.raises(ValueError, match=r"^\$MAITRED_TOKEN: a token needs at least"):
        _config(args, args.worker)


def test_print_config_shows_each_value_as_written_and_where_it_came_from(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, "c.yaml", "policy: tao\nwarmup-prompts: 500\n")
    monkeypatch.setenv("MAITRED_PORT", "9005")
    monkeypatch.setenv("MAITRED_TOKEN", "s" * 24)
    assert main(["serve", "--config", path, "--max-body-mb", "8", "--worker", A, "--print-config"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":")[0]: line for line in out.splitlines() if not line.startswith("#")}
    assert lines["max-body-mb"] == 'max-body-mb: "8"  # --max-body-mb'
    assert lines["port"] == 'port: "9005"  # $MAITRED_PORT'
    assert lines["policy"] == f'policy: "tao"  # {path}: policy'
    assert lines["worker"] == f'worker: ["{A}"]  # --worker'
    assert lines["host"] == 'host: "127.0.0.1"  # default'
    assert lines["token"] == 'token: "***"  # $MAITRED_TOKEN' and "s" * 24 not in out
    # what it prints is a configuration file giving the same settings
    printed = {k: v for k, v in yaml.safe_load(out).items() if k != "token"}
    again = tmp_path / "printed.yaml"
    again.write_text(yaml.safe_dump(printed))
    monkeypatch.delenv("MAITRED_PORT")
    first = settings(["serve", "--config", path, "--max-body-mb", "8", "--worker", A], {"MAITRED_PORT": "9005"})
    second = settings(["serve", "--config", str(again)])
    skip = {"config", "config_sources", "config_shown", "config_layers", "token", "func"}
    assert {k: v for k, v in vars(first).items() if k not in skip} == {k: v for k, v in vars(second).items() if k not in skip}


def test_sim_worker_reads_its_own_variables_and_files_not_the_gateways(tmp_path):
    path = write(tmp_path, "w.toml", 'gpu-tokens = 50000\nhicache-write-policy = "write_back"\n')
    env = {"MAITRED_PORT": "9009", "MAITRED_SIM_WORKER_CPU_TOKENS": "100000", "MAITRED_SIM_WORKER_SCRIPT_TOOLS": "1"}
    config = config_from_args(settings(["sim-worker", "--config", path, "--time-scale", "4"], env))
    assert (config.gpu_tokens, config.cpu_tokens, config.hicache_write_policy, config.script_tools) == (
        50_000,
        100_000,
        "write_back",
        True,
    )
    assert config.time_scale == 4.0 and config.port == 30000  # MAITRED_PORT is the gateway's
    with pytest.raises(ConfigError, match="unknown key 'worker': maitred sim-worker has no --worker"):
        settings(["sim-worker", "--config", write(tmp_path, "w.yaml", f"worker: {A}\n")])


def test_serve_started_with_a_config_file_answers_healthz(tmp_path):
    port = free_port()
    path = write(tmp_path, "maitred.yaml", f"port: {port}\nno-db: true\nlog-level: warning\nallowed-host: [127.0.0.1]\n")
    serve = subprocess.Popen([sys.executable, "-m", "maitred", "serve", "--config", path])
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout_s=90, process=serve)
        health = httpx.get(f"http://127.0.0.1:{port}/healthz")
        assert health.status_code == 200 and health.json()["workers"] == {}
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM after a graceful stop
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def test_the_sample_configuration_is_accepted():
    sample = Path(__file__).parents[1] / "examples" / "maitred.yaml"
    args = settings(["serve", "--config", str(sample)])
    assert args.worker == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"] and args.hold_timeout == 600.0
    assert args.config_sources["worker"] == f"{sample}: worker-urls"
