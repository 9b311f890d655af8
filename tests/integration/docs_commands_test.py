#!/usr/bin/env python3
"""Runs the shell commands of docs/deploy.md, docs/connect.md and docs/viewer.md
as written, against real daemons, wherever this machine can.

Every fenced ```sh block is read. A block whose every line this machine can
run (curl, quantem-gpu, the token one-liners, ...) is run as written, in one
bash with `set -euo pipefail`, with HOME and XDG_RUNTIME_DIR pointing at
temporary folders, `quantem-gpu` on PATH, and these daemons running on the
CPU backend: one on 127.0.0.1:8780 without a token and one on the service's
default socket $XDG_RUNTIME_DIR/quantem-gpu/quantem.sock; then, for blocks
that send a token, one on 127.0.0.1:8780 with the token file
~/.config/quantem-gpu/token. Any other block must start with a command of the
known list below, each naming the test that covers it instead (a remote host,
a systemd user manager, an installation): a command of an unknown kind fails
the test, so a new documented command is either run here or said to be run
elsewhere. Skipped (exit 77) when port 8780 is taken.

Usage: docs_commands_test.py QUANTEM_BINARY SOURCE_DIR
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

DOCS = ["docs/deploy.md", "docs/connect.md", "docs/viewer.md"]
PORT = 8780

# The first word of a line this test runs.
RUNNABLE = re.compile(r"^(curl|quantem-gpu|args=\$\(quantem-gpu|eval \"curl|TOKEN=\$\(cat ~/|"
                      r"python3 -c 'import secrets|chmod 600 ~/|echo \")")
# Lines covered elsewhere, with where.
ELSEWHERE = [
    (r"^(ssh|GPU_UID=\$\(ssh|TOKEN=\$\(ssh)", "needs a remote host (the ssh host 'quantem-gpu serve ...' recipes run in tests/integration/ssh_recipe_test.sh)"),
    (r"^(systemctl|journalctl|loginctl)", "needs a systemd user manager: scripts/test-install.sh runs what the unit runs"),
    (r"^(cmake|git pull|xargs rm|rm |cp |mkdir -p ~/.config/systemd|\$EDITOR|systemd-analyze|P=|\$P/)",
     "an installation: scripts/test-install.sh runs it into a temporary prefix"),
    (r"^(scripts/|conda )", "builds or installs packages: run by scripts/test.sh and scripts/demo.sh"),
    (r"^QUANTEM_GPU_[A-Z_]+=", "a line of quantem-gpu.env, not a command: scripts/test-install.sh reads the example"),
    (r"^echo QUANTEM_GPU_LOG_LEVEL", "edits the service's environment: scripts/test-install.sh"),
]


def commands(block):
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            yield line


def classify(line):
    if RUNNABLE.match(line):
        return None
    for pattern, reason in ELSEWHERE:
        if re.match(pattern, line):
            return reason
    raise SystemExit(f"docs_commands_test: FAILED: a documented command of unknown kind: {line}\n"
                     "run it here (RUNNABLE) or name the test that covers it (ELSEWHERE)")


def wait_until(check, seconds=30):
    end = time.time() + seconds
    while time.time() < end:
        if check():
            return True
        time.sleep(0.1)
    return False


def http_ready(url, unix_socket=None):
    command = ["curl", "-fsS", "-o", "/dev/null", url + "/api/health/ready"]
    if unix_socket:
        command[1:1] = ["--unix-socket", unix_socket]
    return subprocess.run(command, capture_output=True).returncode == 0


class Daemons:
    def __init__(self, binary, env, work):
        self.binary, self.env, self.work, self.running = binary, env, work, []

    def start(self, name, arguments, env=None, ready=None):
        log = open(os.path.join(self.work, name + ".log"), "w")
        process = subprocess.Popen([self.binary, "serve"] + arguments, env=env or self.env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.running.append(process)
        if not wait_until(ready):
            raise SystemExit(f"docs_commands_test: FAILED: the {name} daemon did not become ready: "
                             + open(log.name).read())
        return process

    def stop(self, process):
        process.terminate()
        if process.wait(timeout=30) != 0:
            raise SystemExit(f"docs_commands_test: FAILED: a daemon exited with {process.returncode}")
        self.running.remove(process)

    def stop_all(self):
        for process in list(self.running):
            process.kill()
            process.wait()


def run_block(block, env, source_dir):
    script = "set -euo pipefail\n" + "\n".join(commands(block)) + "\n"
    result = subprocess.run(["bash", "-c", script], env=env, cwd=source_dir, capture_output=True, text=True,
                            timeout=60)
    if result.returncode != 0:
        raise SystemExit(f"docs_commands_test: FAILED (exit {result.returncode}):\n{script}\n"
                         f"stdout: {result.stdout}\nstderr: {result.stderr}")
    print(f"ran:\n{script}-> {result.stdout.strip()[:200]}")


def main():
    binary, source_dir = os.path.realpath(sys.argv[1]), os.path.realpath(sys.argv[2])
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", PORT)) == 0:
            print(f"docs_commands_test: SKIPPED: port {PORT} is taken (the documents use it as written)")
            return 77
    runnable, skipped = [], []
    for doc in DOCS:
        text = open(os.path.join(source_dir, doc)).read()
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            reasons = [reason for reason in map(classify, commands(block)) if reason]
            (skipped if reasons else runnable).append((doc, block, reasons[:1]))
    for doc, block, reason in skipped:
        print(f"not run here ({doc}): {next(commands(block))} ...: {reason[0]}")

    work = tempfile.mkdtemp(prefix="docs-commands-")
    daemons = None
    try:
        home, runtime = os.path.join(work, "home"), os.path.join(work, "xdg")
        os.makedirs(os.path.join(home, ".config", "quantem-gpu"))
        os.makedirs(runtime, mode=0o700)
        env = dict(os.environ, HOME=home, XDG_RUNTIME_DIR=runtime,
                   PATH=os.path.dirname(binary) + os.pathsep + os.environ.get("PATH", ""))
        for name in ("QUANTEM_GPU_RUNTIME_DIR", "QUANTEM_GPU_TOKEN", "QUANTEM_GPU_TOKEN_FILE", "JOURNAL_STREAM"):
            env.pop(name, None)
        data = os.path.join(work, "data")
        subprocess.run([binary, "synth", os.path.join(data, "sample1"), "--scan", "4x4", "--detector", "8x8",
                        "--threads", "1"], check=True, capture_output=True)
        daemons = Daemons(binary, env, work)
        socket_path = os.path.join(runtime, "quantem-gpu", "quantem.sock")
        tcp = f"http://127.0.0.1:{PORT}"
        plain = daemons.start("tcp", [data, "--backend", "cpu", "--port", str(PORT)], ready=lambda: http_ready(tcp))
        daemons.start("socket", [data, "--backend", "cpu", "--unix-socket", socket_path],
                      ready=lambda: http_ready("http://localhost", socket_path))
        token_blocks = [item for item in runnable if "Bearer" in item[1]]
        for doc, block, _ in runnable:
            if "Bearer" not in block:
                run_block(block, env, source_dir)
        daemons.stop(plain)
        token_file = os.path.join(home, ".config", "quantem-gpu", "token")
        if token_blocks:
            if not os.path.exists(token_file):
                raise SystemExit("docs_commands_test: FAILED: no documented command wrote " + token_file)
            daemons.start("token", [data, "--backend", "cpu", "--port", str(PORT), "--auth", "token"],
                          env=dict(env, QUANTEM_GPU_TOKEN_FILE=token_file), ready=lambda: http_ready(tcp))
            for doc, block, _ in token_blocks:
                run_block(block, env, source_dir)
        print(f"docs_commands_test: ran {len(runnable)} blocks as written; {len(skipped)} are run elsewhere")
        return 0
    finally:
        if daemons:
            daemons.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
