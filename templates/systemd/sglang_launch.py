# sgdeploy: start the engine with its API key from the environment, never from argv (docs/router.md, "API keys").
# Rendered into the unit's ExecStart as `python -c "exec(...)" LAUNCHER ARGS...` by sgdeploy.render when the
# config names serving.api_key_secret. SGLang 0.5.23 reads its API key only from --api-key (no environment
# variable), so the key is given to its parser inside this process: /proc/<pid>/cmdline, ps, the unit file
# and the journal never hold it. SGDEPLOY_API_KEY_ENV (set by the unit) names the variable of the env file
# (/etc/sglang/<config>.env, 0640 root:sglang) that holds the key; both are taken out of the environment
# before the engine starts, so its subprocesses do not inherit them. Log records that would show the key
# (0.5.23 logs its server_args at start) are redacted.
import logging
import os
import runpy
import sys

name = os.environ.pop("SGDEPLOY_API_KEY_ENV", "")
key = os.environ.pop(name, "") if name else ""
if not key:
    sys.exit(f"sgdeploy: {name or 'SGDEPLOY_API_KEY_ENV'} is not set in the service's environment "
             "(serving.api_key_secret names a key of the inventory's sglang_secret_env)")
_factory = logging.getLogRecordFactory()


def _redacted(*args, **kwargs):
    record = _factory(*args, **kwargs)
    try:
        text = record.getMessage()
    except Exception:  # noqa: BLE001 - a record that cannot format is left to logging
        return record
    if key in text:
        record.msg, record.args = text.replace(key, "<redacted>"), ()
    return record


logging.setLogRecordFactory(_redacted)
launcher = sys.argv[1:]
if launcher[:1] == ["-m"] and launcher[1].startswith("sglang."):
    # SGLang itself: set the parsed arguments' api_key after parsing, so that not even its recorded
    # launch command (server_args.launch_command) holds the key.
    import sglang.srt.server_args as _server_args

    _parse = _server_args.prepare_server_args

    def _prepare_server_args(argv):
        server_args = _parse(argv)
        server_args.api_key = key
        return server_args

    _server_args.prepare_server_args = _prepare_server_args
    sys.argv = [launcher[1], *launcher[2:]]
    runpy.run_module(launcher[1], run_name="__main__", alter_sys=True)
elif launcher[:1] == ["-m"]:
    sys.argv = [launcher[1], *launcher[2:], "--api-key", key]
    runpy.run_module(launcher[1], run_name="__main__", alter_sys=True)
else:
    # A launcher script (the lab's simulated engine): the key is added to its arguments in this process only.
    sys.argv = [launcher[0], *launcher[1:], "--api-key", key]
    runpy.run_path(launcher[0], run_name="__main__")
