"""ClusterSpec.from_env: every launcher's variables, their precedence, every bad input."""

from __future__ import annotations

import json
import pickle

import pytest

from pycollective.rendezvous import ClusterSpec
from pycollective.rendezvous.cluster import first_slurm_host, is_loopback, parse_address

pytestmark = pytest.mark.timeout(10)

TOKEN = {"PYCOLLECTIVE_TOKEN": "secret"}


def spec(env: dict[str, str], **overrides) -> ClusterSpec:
    return ClusterSpec.from_env(env, **overrides)


def error(env: dict[str, str], **overrides) -> str:
    with pytest.raises(ValueError) as info:
        ClusterSpec.from_env(env, **overrides)
    return str(info.value)


def tf_config(cluster: dict, task_type: str, index: int) -> dict[str, str]:
    return {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
    }


PYCOLLECTIVE_ENV = {
    "PYCOLLECTIVE_RANK": "2",
    "PYCOLLECTIVE_WORLD_SIZE": "4",
    "PYCOLLECTIVE_LOCAL_RANK": "0",
    "PYCOLLECTIVE_LOCAL_SIZE": "2",
    "PYCOLLECTIVE_MASTER_ADDR": "10.0.0.1",
    "PYCOLLECTIVE_MASTER_PORT": "29400",
    **TOKEN,
}
TORCHRUN_ENV = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "node7",
    "MASTER_PORT": "29500",
    **TOKEN,
}
OMPI_ENV = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "PYCOLLECTIVE_MASTER_ADDR": "head",
    "PYCOLLECTIVE_MASTER_PORT": "29400",
    **TOKEN,
}
SLURM_ENV = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "6",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_JOB_NODELIST": "node[1-3],other",
    "SLURM_JOB_ID": "123456",
    **TOKEN,
}


# -- defaults and pycollective's own launcher ----------------------------------------


def test_no_launcher_is_a_single_process_group():
    s = spec({})
    assert (s.rank, s.world_size, s.local_rank, s.local_size) == (0, 1, 0, 1)
    assert (s.master_addr, s.master_port, s.token) == ("127.0.0.1", 0, None)
    assert "no launcher" in s.source


def test_pycollective_variables():
    s = spec(PYCOLLECTIVE_ENV)
    assert (s.rank, s.world_size, s.local_rank, s.local_size) == (2, 4, 0, 2)
    assert s.master == "10.0.0.1:29400"
    assert s.token == "secret"
    assert "PYCOLLECTIVE_" in s.source


def test_host_id_override_and_default(monkeypatch):
    assert spec({**PYCOLLECTIVE_ENV, "PYCOLLECTIVE_HOST_ID": "fake-b"}).host_id == "fake-b"
    monkeypatch.setattr("socket.gethostname", lambda: "real-host")
    assert spec(PYCOLLECTIVE_ENV).host_id == "real-host"


def test_local_rank_unknown_when_launcher_does_not_say():
    env = {k: v for k, v in PYCOLLECTIVE_ENV.items() if "LOCAL" not in k}
    s = spec(env)
    assert (s.local_rank, s.local_size) == (None, None)


# -- TF_CONFIG -----------------------------------------------------------------


CLUSTER = {
    "chief": ["c0:2222"],
    "worker": ["w0:2222", "w1:2222", "c0:2223"],
    "ps": ["p0:2222"],
}


@pytest.mark.parametrize(
    ("task_type", "index", "rank"),
    [("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2), ("worker", 2, 3)],
)
def test_tf_config_rank_order_is_chief_then_workers(task_type, index, rank):
    s = spec({**tf_config(CLUSTER, task_type, index), **TOKEN})
    assert (s.rank, s.world_size) == (rank, 4)
    assert s.master == "c0:2222"  # the chief hosts the coordinator
    assert s.source == "TF_CONFIG"


def test_tf_config_local_rank_from_hosts():
    s = spec({**tf_config(CLUSTER, "worker", 2), **TOKEN})  # c0:2223 shares host c0
    assert (s.local_rank, s.local_size) == (1, 2)


def test_tf_config_without_chief_uses_worker_0():
    s = spec({**tf_config({"worker": ["a:1", "b:2"]}, "worker", 1), **TOKEN})
    assert (s.rank, s.world_size, s.master) == (1, 2, "a:1")


def test_tf_config_index_may_be_a_digit_string():
    env = {
        "TF_CONFIG": json.dumps(
            {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": "1"}}
        ),
        **TOKEN,
    }
    assert spec(env).rank == 1


@pytest.mark.parametrize(
    ("task_type", "role"), [("ps", "a parameter server"), ("evaluator", "an evaluator")]
)
def test_tf_config_ps_and_evaluator_are_not_in_the_group(task_type, role):
    cluster = {**CLUSTER, "evaluator": ["e0:2222"]}
    message = error({**tf_config(cluster, task_type, 0), **TOKEN})
    assert role in message
    assert "not part of the collective group" in message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"task": {"type": "worker", "index": 0}}), 'no "cluster"'),
        (json.dumps({"cluster": {"worker": ["a:1"]}}), 'no "task"'),
        (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}), '"task.type"'),
        (
            json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}),
            "lists 1 address",
        ),
        (
            json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}),
            "non-negative integer",
        ),
        (
            json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "boss", "index": 0}}),
            '"boss"',
        ),
        (
            json.dumps(
                {"cluster": {"worker": ["nohostport"]}, "task": {"type": "worker", "index": 0}}
            ),
            "malformed",
        ),
        (
            json.dumps({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}),
            "must be a list",
        ),
        (
            json.dumps(
                {"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}
            ),
            "at most one chief",
        ),
        (
            json.dumps({"cluster": {"ps": ["a:1"]}, "task": {"type": "chief", "index": 0}}),
            "lists 0 address",
        ),
    ],
)
def test_tf_config_bad_input_says_what_and_shows_an_example(raw, expected):
    message = error({"TF_CONFIG": raw, **TOKEN})
    assert "TF_CONFIG" in message
    assert expected in message
    assert '"cluster": {"chief"' in message  # the example JSON


# -- torchrun, Open MPI, Slurm -----------------------------------------------------


def test_torchrun_variables():
    s = spec(TORCHRUN_ENV)
    assert (s.rank, s.world_size, s.local_rank, s.local_size) == (1, 2, 1, 2)
    # torchrun's agent store owns MASTER_PORT; the coordinator takes the next one.
    assert s.master == "node7:29501"
    assert "torchrun" in s.source and "MASTER_PORT+1" in s.source


def test_bracketed_ipv6_master_addr_is_taken_as_the_bare_address():
    for name in ("MASTER_ADDR", "PYCOLLECTIVE_MASTER_ADDR"):
        s = spec({**TORCHRUN_ENV, name: "[fd00::1]"})
        assert (s.master_addr, s.master) == ("fd00::1", "[fd00::1]:29501"), name


def test_pycollective_master_port_beats_torch_master_port():
    s = spec({**TORCHRUN_ENV, "PYCOLLECTIVE_MASTER_PORT": "31000"})
    assert s.master == "node7:31000"


def test_torchrun_without_master_addr():
    env = {k: v for k, v in TORCHRUN_ENV.items() if k != "MASTER_ADDR"}
    message = error(env)
    assert "no coordinator address" in message and "PYCOLLECTIVE_MASTER_ADDR" in message
    assert "torchrun" in message


def test_open_mpi_variables():
    s = spec(OMPI_ENV)
    assert (s.rank, s.world_size, s.local_rank, s.local_size) == (3, 8, 1, 2)
    assert s.master == "head:29400"
    assert "Open MPI" in s.source


def test_open_mpi_master_from_torch_variables():
    env = {k: v for k, v in OMPI_ENV.items() if not k.startswith("PYCOLLECTIVE_MASTER")}
    s = spec({**env, "MASTER_ADDR": "head2", "MASTER_PORT": "29500"})
    assert s.master == "head2:29501"


def test_open_mpi_without_master():
    env = {k: v for k, v in OMPI_ENV.items() if not k.startswith("PYCOLLECTIVE_MASTER")}
    message = error(env)
    assert "no coordinator address" in message and "Open MPI" in message


def test_slurm_variables_and_nodelist_master():
    s = spec(SLURM_ENV)
    assert (s.rank, s.world_size, s.local_rank, s.local_size) == (5, 6, 1, 2)
    assert s.master_addr == "node1"
    assert s.master_port == 20000 + (123456 % 1000) * 10  # step 0
    assert "SLURM_JOB_ID" in s.source


def test_slurm_port_differs_per_step_and_the_step_node_list_names_rank_0():
    step = {**SLURM_ENV, "SLURM_STEP_ID": "3", "SLURM_STEP_NODELIST": "node[2-3]"}
    s = spec(step)
    assert s.master_port == 20000 + (123456 % 1000) * 10 + 3
    assert s.master_addr == "node2"


def test_slurm_master_addr_beats_nodelist():
    s = spec({**SLURM_ENV, "MASTER_ADDR": "login", "MASTER_PORT": "29500"})
    assert s.master == "login:29501"


def test_slurm_local_size_derived_from_tasks_per_node():
    env = {k: v for k, v in SLURM_ENV.items() if k != "SLURM_NTASKS_PER_NODE"}
    assert spec({**env, "SLURM_TASKS_PER_NODE": "2(x3)"}).local_size == 2
    last_node = {**env, "SLURM_LOCALID": "0", "SLURM_NODEID": "2"}
    assert spec({**last_node, "SLURM_TASKS_PER_NODE": "2(x2),1"}).local_size == 1
    assert spec(env).local_size is None
    message = error({**env, "SLURM_TASKS_PER_NODE": "two"})
    assert "SLURM_TASKS_PER_NODE" in message and "2(x3),1" in message


def test_slurm_without_nodelist_or_master():
    env = {k: v for k, v in SLURM_ENV.items() if k != "SLURM_JOB_NODELIST"}
    assert "no coordinator address" in error(env)


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node[1-3],other", "node1"),
        ("node[01-03]", "node01"),
        ("a,b", "a"),
        ("gpu[7,9-10]-ib,x", "gpu7-ib"),
        ("rack[1-2]-n[3-4]", "rack1-n3"),
        ("single", "single"),
    ],
)
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


@pytest.mark.parametrize("nodelist", ["", "node[1-3", ",a"])
def test_first_slurm_host_malformed(nodelist):
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        first_slurm_host(nodelist)


# -- precedence and overrides ---------------------------------------------------------


def test_precedence_pycollective_then_tf_config_then_torchrun_then_mpi_then_slurm():
    tf = tf_config({"worker": ["a:1", "b:2", "c:3"]}, "worker", 1)
    layers = [PYCOLLECTIVE_ENV, tf, TORCHRUN_ENV, OMPI_ENV, SLURM_ENV]
    expected = ["PYCOLLECTIVE_", "TF_CONFIG", "torchrun", "Open MPI", "Slurm"]
    for i, word in enumerate(expected):
        env: dict[str, str] = {}
        for layer in reversed(layers[i:]):
            env.update(layer)
        if i > 0:  # the lower layers' own PYCOLLECTIVE_* variables must not leak in
            env = {k: v for k, v in env.items() if not k.startswith("PYCOLLECTIVE_RANK")}
            env = {k: v for k, v in env.items() if not k.startswith("PYCOLLECTIVE_WORLD")}
        assert word in spec(env).source, (i, spec(env).source)


def test_overrides_win_and_are_named_in_the_source():
    s = spec(TORCHRUN_ENV, rank=0, master="[::1]:4000", token="other")
    assert (s.rank, s.world_size, s.master_addr, s.master_port) == (0, 2, "::1", 4000)
    assert s.master == "[::1]:4000"
    assert s.token == "other"
    assert "arguments (rank, master, token)" in s.source
    # A changed rank invalidates the launcher's local layout.
    assert (s.local_rank, s.local_size) == (None, None)


def test_overrides_alone_need_no_launcher():
    s = spec({}, rank=1, world_size=2, master="127.0.0.1:1234", token="t")
    assert (s.rank, s.world_size, s.master) == (1, 2, "127.0.0.1:1234")
    assert s.source.startswith("arguments (")


def test_token_from_environment_or_override():
    assert spec(TORCHRUN_ENV).token == "secret"
    assert spec(TORCHRUN_ENV, token="x").token == "x"


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "overrides", "expected"),
    [
        (
            {**PYCOLLECTIVE_ENV, "PYCOLLECTIVE_RANK": "two"},
            {},
            "PYCOLLECTIVE_RANK='two' is not an integer",
        ),
        ({**PYCOLLECTIVE_ENV, "PYCOLLECTIVE_RANK": "-1"}, {}, "negative"),
        ({**PYCOLLECTIVE_ENV, "PYCOLLECTIVE_RANK": "4"}, {}, "rank 4 is outside [0, world_size=4)"),
        ({**PYCOLLECTIVE_ENV, "PYCOLLECTIVE_WORLD_SIZE": "0"}, {}, "world_size must be >= 1"),
        ({**PYCOLLECTIVE_ENV, "PYCOLLECTIVE_LOCAL_RANK": "2"}, {}, "local_rank 2 is outside"),
        (
            {**PYCOLLECTIVE_ENV, "PYCOLLECTIVE_MASTER_PORT": "http"},
            {},
            "PYCOLLECTIVE_MASTER_PORT='http'",
        ),
        ({**PYCOLLECTIVE_ENV, "PYCOLLECTIVE_MASTER_PORT": "70000"}, {}, "not a TCP port"),
        (
            {**PYCOLLECTIVE_ENV, "PYCOLLECTIVE_MASTER_PORT": "0"},
            {},
            "cannot find an OS-chosen port",
        ),
        (
            {**TORCHRUN_ENV, "WORLD_SIZE": "x"},
            {},
            "WORLD_SIZE='x' is not an integer (from torchrun",
        ),
        ({**OMPI_ENV, "OMPI_COMM_WORLD_SIZE": "1.5"}, {}, "OMPI_COMM_WORLD_SIZE='1.5'"),
        ({**SLURM_ENV, "SLURM_PROCID": "p"}, {}, "SLURM_PROCID='p' is not an integer (from Slurm"),
        ({"PYCOLLECTIVE_RANK": "0"}, {}, "PYCOLLECTIVE_WORLD_SIZE is not set"),
        ({}, {"rank": 1}, "rank 1 is outside"),
        ({}, {"rank": 0, "world_size": 2, "token": "t"}, "no coordinator address"),
        (
            {},
            {"rank": 0, "world_size": 2, "master": "nohost", "token": "t"},
            "master='nohost' is malformed",
        ),
        ({}, {"rank": "0", "world_size": 1}, "rank= must be an int"),
    ],
)
def test_bad_input_says_what_is_wrong(env, overrides, expected):
    assert expected in error(env, **overrides)


def test_variable_errors_show_the_expected_shape():
    message = error({"PYCOLLECTIVE_RANK": "0"})
    assert "PYCOLLECTIVE_RANK=0 PYCOLLECTIVE_WORLD_SIZE=4" in message
    assert "from pycollective launcher" in message


@pytest.mark.parametrize("master_addr", ["127.0.0.1", "localhost", "10.0.0.1"])
def test_multi_rank_group_needs_a_token_even_on_loopback(master_addr):
    env = {k: v for k, v in PYCOLLECTIVE_ENV.items() if k != "PYCOLLECTIVE_TOKEN"}
    message = error({**env, "PYCOLLECTIVE_MASTER_ADDR": master_addr})
    assert "no cluster token" in message
    assert "PYCOLLECTIVE_TOKEN" in message and "pycollective run" in message


def test_empty_token_is_refused():
    assert "token is empty" in error(PYCOLLECTIVE_ENV, token="")


# -- helpers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("h:1", ("h", 1)), ("10.0.0.1:29400", ("10.0.0.1", 29400)), ("[::1]:5", ("::1", 5))],
)
def test_parse_address(text, parsed):
    assert parse_address(text) == parsed


@pytest.mark.parametrize("text", ["h", ":1", "h:", "h:x", "h:70000"])
def test_parse_address_rejects(text):
    with pytest.raises(ValueError, match="host:port"):
        parse_address(text)


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("node1")
    assert spec(PYCOLLECTIVE_ENV).master_is_loopback is False


def test_spec_pickles():
    s = spec(PYCOLLECTIVE_ENV)
    assert pickle.loads(pickle.dumps(s)) == s


def test_announced_coordinator_port():
    """init(announce=): rank 0's service may take an OS-chosen port (0), which it announces;
    the other ranks still need a real address."""
    spec = ClusterSpec.from_env(
        {}, rank=0, world_size=2, master="127.0.0.1:0", token="t", announced=True
    )
    assert spec.master_port == 0 and spec.announced
    with pytest.raises(ValueError, match="master_port is 0"):
        ClusterSpec.from_env(
            {}, rank=1, world_size=2, master="127.0.0.1:0", token="t", announced=True
        )
    with pytest.raises(ValueError, match="master_port is 0"):
        ClusterSpec.from_env({}, rank=0, world_size=2, master="127.0.0.1:0", token="t")
