"""Security of a running server: loopback only, private token files, confined paths, no pickle.

What the http transport tests already cover (401 without or with a wrong token, refusing to
serve off loopback without a token, the body size limit) is not repeated here.
"""

from __future__ import annotations

import hmac
import pickle
import re
import stat
from pathlib import Path

import numpy as np
import psutil
import pytest
from support.leaks import files_holding, ray_session_logs
from support.pickles import Tripwire

from arctic_platform.rl.wire.frames import FRAME_CONTENT_TYPE

pytestmark = pytest.mark.slow


def _listening(pid: int) -> list[tuple[str, int, int, str]]:
    """Every listening (TCP) or bound (UDP) address of ``pid`` and its descendants."""
    found = []
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="inet")
            name = proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr):  # UDP bound
                found.append((c.laddr.ip, c.laddr.port, proc.pid, name))
    return found


def _loopback(ip: str) -> bool:
    return ip.startswith(("127.", "::ffff:127.")) or ip == "::1"


def test_the_server_and_every_process_it_started_listen_on_loopback_only(live):
    addresses = _listening(live.pid)
    assert addresses, "found no listening socket at all"
    jobs = {
        pid: f"{j['job_type']} job {j['job_id']}"
        for j in live.client.get_server_state()["jobs"]
        for pid in j["worker_pids"]
    }
    exposed = [(*a, jobs.get(a[2], "")) for a in addresses if not _loopback(a[0])]
    assert not exposed, f"listening beyond loopback (ip, port, pid, process, job): {exposed}"
    port = int(live.base_url.rsplit(":", 1)[1])
    assert ("127.0.0.1", port) in {(a[0], a[1]) for a in addresses}


def test_token_files_in_the_run_dir_are_readable_by_the_owner_only(live):
    named = re.compile(r"(^|[_.-])token($|[_.-])")  # token, ray_auth_token; not tokenizer.json
    tokens = [p for p in live.run_dir.rglob("*") if p.is_file() and named.search(p.name)]
    assert live.run_dir / "token" in tokens
    for path in tokens:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_no_answer_or_log_reveals_the_token(live):
    session = live.client.open_session(ttl=600)  # its key is a secret too
    wrong_key = session.api_key[::-1]
    try:
        with live.http() as http:
            job = live.job_ids["training"]
            bodies = [http.get(p).text for p in ("/status", "/metrics", f"/job/{job}")]
            bodies.append(http.get("/openapi.json").text)
            wrong = live.token[::-1]
            refused = http.get("/status", headers={"Authorization": f"Bearer {wrong}"})
            assert refused.status_code == 401
            bodies.append(refused.text)
            models = f"{session.base_url_path}/models"
            used = http.get(models, headers={"Authorization": f"Bearer {session.api_key}"})
            assert used.status_code == 200, used.text
            bodies.append(used.text)
            refused_key = http.get(models, headers={"Authorization": f"Bearer {wrong_key}"})
            assert refused_key.status_code == 401, refused_key.text
            bodies.append(refused_key.text)
            bodies.append(http.get("/sessions", params={"job_id": session.job_id}).text)
        for body in bodies:
            assert live.token not in body and session.api_key not in body
        assert wrong not in refused.text, "a refused token is echoed back"
        assert wrong_key not in refused_key.text, "a refused session key is echoed back"
        # every file a secret could reach: the run dir (server log, job table and its change
        # log, job logs), the client's ARCTIC_RL_HOME around it, Ray's session logs; not the
        # token files themselves, nor the session's journal (private: it holds its key so that
        # `serve --resume` can bring the session back)
        for written in ("server.log", "job_table.json"):
            assert (live.run_dir / written).is_file(), written
        secrets = {
            "the server token": live.token,
            "the wrong token": wrong,
            "the session key": session.api_key,
            "the wrong session key": wrong_key,
        }
        ray_token = live.run_dir / "ray_auth_token"
        if ray_token.is_file():
            secrets["the Ray token"] = ray_token.read_text().strip()
        journal = (live.run_dir / "sessions" / f"{session.session_id}.jsonl").resolve()
        assert journal.is_file() and stat.S_IMODE(journal.stat().st_mode) == 0o600
        private = {(live.run_dir / "token").resolve(), ray_token.resolve(), journal}
        roots = [live.run_dir, live.home, *ray_session_logs(live.pid)]
        leaks = files_holding(secrets, roots, skip=private.__contains__)
        assert not leaks, f"a secret was written to a file: {leaks}"
    finally:
        live.client.close_session(session.session_id)


def test_status_names_no_path_outside_the_run_dir_but_the_model(live):
    allowed = (str(live.run_dir), live.client.config.model_name)
    with live.http() as http:
        status = http.get("/status").json()
        metrics = http.get("/metrics").json()

    def strings(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)
        elif isinstance(value, str):
            yield value

    paths = [s for s in [*strings(status), *strings(metrics)] if "/" in s]
    stray = [p for p in paths if not p.startswith(allowed)]
    assert not stray, f"paths outside the run dir: {stray}"


OUTSIDE = [
    "../escape",
    "../../../../tmp/escape",
    "/tmp/escape",
    "a/../../escape",
    "..",
    ".",
    ".hidden",
    "sub/dir",
    "back\\slash",
]


@pytest.mark.parametrize("tag", OUTSIDE)
def test_a_checkpoint_tag_that_leaves_the_checkpoint_root_is_refused(live, tag):
    with live.http() as http:
        answer = http.post(
            "/save-checkpoint", json={"job_id": live.job_ids["training"], "tag": tag}
        )
    assert answer.status_code == 422 and "tag" in answer.json()["message"], answer.text
    assert not Path("/tmp/escape").exists()
    assert not (live.run_dir / "checkpoints" / "escape").exists()
    live.assert_healthy()


@pytest.mark.parametrize("path", ["../", "/etc", "/tmp", "../../..", "job_1/../../../"])
def test_a_load_path_outside_the_checkpoint_root_is_refused(live, path):
    with live.http() as http:
        answer = http.post(
            "/load-checkpoint", json={"job_id": live.job_ids["training"], "path": path}
        )
    assert answer.status_code == 422 and "outside" in answer.json()["message"], answer.text
    live.assert_healthy()


def test_a_load_path_inside_the_root_that_holds_no_checkpoint_is_a_404(live):
    training = live.job_ids["training"]
    empty = live.run_dir / "checkpoints" / f"job_{training}" / "not-a-checkpoint"
    empty.mkdir(parents=True, exist_ok=True)
    try:
        with live.http() as http:
            answer = http.post("/load-checkpoint", json={"job_id": training, "path": empty.name})
        assert answer.status_code == 404, answer.text
        assert "no complete checkpoint" in answer.json()["message"]
    finally:
        empty.rmdir()
    live.assert_healthy()


def test_a_symlink_out_of_the_checkpoint_root_is_refused(live, tmp_path):
    training = live.job_ids["training"]
    root = live.run_dir / "checkpoints" / f"job_{training}"
    root.mkdir(parents=True, exist_ok=True)
    link = root / "looks-inside"
    link.symlink_to(tmp_path)
    try:
        with live.http() as http:
            answer = http.post("/load-checkpoint", json={"job_id": training, "path": link.name})
        assert answer.status_code == 422 and "outside" in answer.json()["message"]
    finally:
        link.unlink()


@pytest.mark.parametrize(
    "content_type",
    [FRAME_CONTENT_TYPE, "application/json", "application/python-pickle", "application/x-npy"],
)
def test_a_pickle_in_a_request_is_never_loaded(live, tmp_path, content_type):
    tripwire = tmp_path / "unpickled"
    body = pickle.dumps({"job_id": live.job_ids["training"], "batch": Tripwire(tripwire)})
    with live.http() as http:
        for path in ("/fwd-bwd", "/generate", "/load-checkpoint", "/initialize"):
            answer = http.post(path, content=body, headers={"Content-Type": content_type})
            assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text)
            assert "message" in answer.json()
    assert not tripwire.exists(), "the server unpickled a request body"
    live.assert_healthy()


@pytest.mark.parametrize("depth", [2_000, 200_000])
def test_deeply_nested_bodies_are_refused_without_a_server_error(live, depth):
    from safetensors.numpy import save

    training = live.job_ids["training"]
    nested = "[" * depth + "]" * depth
    body = f'{{"job_id": {training}, "batch": {{"input_ids": {nested}}}}}'
    frame = save({"t": np.zeros(1)}, metadata={"arctic_rl.skeleton": body})
    with live.http() as http:
        as_json = http.post(
            "/fwd-bwd", content=body.encode(), headers={"Content-Type": "application/json"}
        )
        as_frame = http.post(
            "/fwd-bwd", content=frame, headers={"Content-Type": FRAME_CONTENT_TYPE}
        )
    assert 400 <= as_json.status_code < 500 and "nested" in as_json.json()["message"]
    assert as_frame.status_code == 422 and "nested" in as_frame.json()["message"]
    live.assert_healthy()


def test_a_torch_save_file_sent_as_a_frame_is_refused(live, tmp_path):
    import torch

    target = tmp_path / "t.pt"
    torch.save({"input_ids": torch.ones(2, 3, dtype=torch.long)}, target)
    with live.http() as http:
        answer = http.post(
            "/fwd-bwd",
            content=target.read_bytes(),
            headers={"Content-Type": FRAME_CONTENT_TYPE},
        )
    assert answer.status_code == 422 and "frame" in answer.json()["message"].lower()
    live.assert_healthy()


def test_the_token_check_is_a_constant_time_comparison(tmp_path, monkeypatch):
    """The app compares tokens with hmac.compare_digest (in its bearer guard, web/guards.py),
    whatever the supplied value."""
    import httpx

    from arctic_platform.rl.server.rl_server import RLServer
    from arctic_platform.rl.web import guards
    from arctic_rl_http import app as app_module

    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(guards.hmac, "compare_digest", recording)  # the http app's bearer guard
    app = app_module.build_app(RLServer(run_dir=tmp_path), "right-token")
    transport = httpx.ASGITransport(app=app)

    async def probe() -> list[int]:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            codes = []
            for supplied in ("right-token", "wrong", "r", "right-tokenX"):
                answer = await client.get(
                    "/status", headers={"Authorization": f"Bearer {supplied}"}
                )
                codes.append(answer.status_code)
            return codes

    import asyncio

    assert asyncio.run(probe()) == [200, 401, 401, 401]
    assert [a for a, _ in seen] == [b"right-token", b"wrong", b"r", b"right-tokenX"]
    assert all(b == b"right-token" for _, b in seen)
