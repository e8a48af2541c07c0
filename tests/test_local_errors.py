"""Bad input to LocalCommunicator: a ValueError/TypeError naming the replica and the problem,
raised before anything is modified."""

from __future__ import annotations

import numpy as np
import pytest

import pycollective as pc


@pytest.fixture(scope="module")
def comm():
    return pc.LocalCommunicator(3, timeout=20)


def xs(n=3, dtype=np.float32, shape=(4,)):
    return [np.full(shape, i + 1, dtype) for i in range(n)]


def test_wrong_number_of_arrays(comm):
    with pytest.raises(ValueError, match="expects 3 tensors"):
        comm.allreduce(xs(2))
    with pytest.raises(TypeError, match="list of 3"):
        comm.allreduce(np.ones(3))


def test_mismatched_shapes_and_dtypes(comm):
    a = xs()
    a[2] = np.ones(5, np.float32)
    with pytest.raises(ValueError, match="replica 2 passed shape"):
        comm.allreduce(a)
    b = xs()
    b[1] = b[1].astype(np.float64)
    with pytest.raises(TypeError, match="replica 1 passed float64"):
        comm.allreduce(b)


def test_unsupported_dtype(comm):
    with pytest.raises(TypeError, match="replica 0: unsupported dtype complex64"):
        comm.allreduce([np.ones(2, np.complex64)] * 3)
    with pytest.raises(TypeError, match="unsupported dtype bool"):
        comm.allreduce([np.ones(2, bool)] * 3)


def test_unknown_op_and_algorithm(comm):
    with pytest.raises(ValueError, match="unknown op 'median'"):
        comm.allreduce(xs(), op="median")
    with pytest.raises(ValueError, match="unknown algorithm 'tree'.*ring"):
        comm.allreduce(xs(), algo="tree")
    with pytest.raises(ValueError, match="halving_doubling.*power-of-two"):
        comm.reduce_scatter(xs(), algo="halving_doubling")
    with pytest.raises(ValueError, match="hierarchical.*allreduce only"):
        comm.broadcast(xs(), algo="hierarchical")


def test_integer_avg_is_refused(comm):
    with pytest.raises(TypeError, match="avg is not defined for int32"):
        comm.allreduce(xs(dtype=np.int32), op="avg")


def test_readonly_inplace_is_refused_before_anything_moves(comm):
    a = xs()
    a[1].flags.writeable = False
    with pytest.raises(ValueError, match="replica 1: inplace=True but the array is read-only"):
        comm.allreduce(a, inplace=True)
    assert [float(x[0]) for x in a] == [1.0, 2.0, 3.0]


def test_strided_inplace_is_refused(comm):
    base = [np.ones((4, 4), np.float32) for _ in range(3)]
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.allreduce([b[:, 1] for b in base], inplace=True)


def test_unwritable_out_is_refused_naming_out(comm):
    """An out= that cannot take the result is named as the output, not as inplace=True (which
    the caller did not pass), and is not advised to be copied: a copy would lose the result."""
    outs = [np.empty(4, np.float32) for _ in range(3)]
    outs[2].flags.writeable = False
    with pytest.raises(ValueError, match=r"replica 2 \(out=\): the output array is read-only"):
        comm.allreduce(xs(), out=outs)
    strided = [np.empty(8, np.float32)[::2] for _ in range(3)]
    with pytest.raises(ValueError, match="the output must be a C-contiguous array") as info:
        comm.allreduce(xs(), out=strided)
    assert "inplace" not in str(info.value) and "ascontiguousarray" not in str(info.value)


def test_bad_out_buffers(comm):
    with pytest.raises(ValueError, match="out= has shape"):
        comm.allreduce(xs(), out=[np.empty(5, np.float32)] * 3)
    with pytest.raises(TypeError, match="out= has dtype float64"):
        comm.allreduce(xs(), out=[np.empty(4, np.float64)] * 3)
    with pytest.raises(ValueError, match="either inplace=True or out="):
        comm.allreduce(xs(), inplace=True, out=xs())


def test_bad_root_and_sizes():
    with pytest.raises(ValueError, match="root must be"):
        pc.LocalCommunicator(2).broadcast(xs(2), root=2)
    with pytest.raises(ValueError, match="positive integer"):
        pc.LocalCommunicator(0)


def test_empty_arrays_are_a_noop(comm):
    outs = comm.allreduce([np.empty((0, 3), np.float32)] * 3)
    assert all(o.shape == (0, 3) for o in outs)


def test_group_survives_bad_input(comm):
    with pytest.raises(ValueError):
        comm.allreduce(xs(2))
    assert (comm.allreduce(xs())[0] == 6).all()


def test_errors_pickle():
    import pickle

    e = pc.CollectiveTimeout("[rank 1/2] allreduce#3 timed out")
    assert str(pickle.loads(pickle.dumps(e))) == str(e)
    assert isinstance(e, pc.CollectiveError) and isinstance(e, TimeoutError)


@pytest.mark.parametrize("algo", ["auto", "inline", "ring", "direct"])
def test_replicas_writing_shared_memory_are_refused(comm, algo):
    """The replicas run at once: one array for every replica in place, or an out= that is
    another replica's input, would give a result that depends on the algorithm."""
    x = np.ones(1024, np.float32)
    with pytest.raises(ValueError, match="replica 0 and replica 1 write their results into"):
        comm.allreduce([x] * 3, inplace=True, algo=algo)
    assert (x == 1).all()
    a = xs()
    with pytest.raises(ValueError, match="replica 0 writes its result into memory that replica 1"):
        comm.allreduce(a, out=[a[1], a[0], a[2]], algo=algo)
    # Disjoint parts of one buffer are separate arrays.
    whole = np.concatenate(xs())
    parts = [whole[0:4], whole[4:8], whole[8:12]]
    comm.allreduce(parts, inplace=True, algo=algo)
    assert (whole == 6).all()
    comm.allreduce([x] * 3, algo=algo)  # one input read by every replica is fine
