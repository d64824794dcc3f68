"""``kvsched replay`` and ``kvsched profile`` on bad input: cost models, illegal schedules, outputs, memory.

The tiny model on CPU, one thread, no warm-up; a command that must refuse is
checked to refuse before the model does any work where that matters.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvsched.cli import main
from kvsched.errors import InputError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances import EXAMPLES_DIR
from kvsched.instances.io import save_instance
from kvsched.schedule.io import save_schedule
from tests.test_executor import instances, schedule_of

FAST = ["--threads", "1", "--warmup", "0"]
#: A shipped coefficient set (seconds): a schedule simulated with it has its durations, not the instance's.
SHIPPED = "llama-2-7b_a100-80gb_tp1"


@pytest.fixture
def files(tmp_path):
    instance = instances()["chunked"]
    save_instance(instance, tmp_path / "inst.json")
    save_schedule(schedule_of("sarathi", "chunked"), instance, tmp_path / "sched.json")
    return tmp_path


def _replay(tmp, *extra: str, schedule: str = "sched.json") -> int:
    out = tmp / "m.csv"
    return main(["replay", str(tmp / "inst.json"), str(tmp / schedule), "--out", str(out), *FAST, *extra])


def test_cost_param_alone_changes_the_instance_model(torch, files, capsys):
    # The instance's infermax-linear with a larger fixed cost: the predictions change, the durations
    # (checked against the instance's own model) do not.
    assert _replay(files, "--cost-param", "a0=5") == 0
    table = pd.read_csv(files / "m.csv")
    assert (table.predicted_s > table.duration).all()
    meta = json.loads((files / "m.json").read_text())
    assert meta["predicted_with"] == "the instance's 'infermax-linear' with a0=5"
    capsys.readouterr()


@pytest.mark.parametrize("param", ["a0=nan", "a0=-1", "nope=1"])
def test_bad_cost_param_is_one_error_before_the_model(torch, files, capsys, monkeypatch, param):
    import kvsched.commands.executor as ex

    monkeypatch.setattr(ex, "_model", lambda args: pytest.fail("the model was built"))
    assert _replay(files, "--cost-param", param) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvsched replay: error:")
    assert "Traceback" not in err[0]


def test_a_cost_model_that_times_no_batch_is_refused_naming_the_flag(torch, files, capsys, monkeypatch):
    import kvsched.commands.executor as ex

    monkeypatch.setattr(ex, "_model", lambda args: pytest.fail("the model was built"))
    assert _replay(files, "--cost-model", "unit", "--cost-param", "slot=0") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cost-model/--cost-param" in err[0] and "np.float64" not in err[0]


def test_a_schedule_made_with_a_cost_model_replays_with_it(torch, files, capsys):
    from kvsched.costmodel import make_cost_model
    from kvsched.costmodel.coeffile import resolve_cost_model

    instance = instances()["chunked"]
    cost = make_cost_model(*resolve_cost_model(SHIPPED))
    timed = simulate(instance, make_policy("sarathi"), cost_model=cost).schedule
    save_schedule(timed, instance, files / "timed.json")
    # Durations in seconds of SHIPPED: the instance's model does not give them, --cost-model does.
    assert _replay(files, "--cost-model", SHIPPED, schedule="timed.json") == 0
    table = pd.read_csv(files / "m.csv")
    np.testing.assert_allclose(table.predicted_s, table.duration, rtol=1e-9)
    capsys.readouterr()
    # Without it the durations are wrong for the instance: an illegal schedule (exit 1).
    assert _replay(files, schedule="timed.json") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "wrong-duration" in err[0] and "kvsched validate lists them" in err[0]


def test_an_illegal_schedule_is_refused_before_the_model_with_exit_1(torch, files, capsys, monkeypatch):
    import kvsched.commands.executor as ex

    doc = json.loads((files / "sched.json").read_text())
    doc["batches"].pop()  # the last batch: a request never completes, found only at the end
    (files / "cut.json").write_text(json.dumps(doc))
    monkeypatch.setattr(ex, "_model", lambda args: pytest.fail("the model was built"))
    assert _replay(files, schedule="cut.json") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a legal schedule" in err[0] and "[incomplete]" in err[0]
    assert not (files / "m.csv").exists()


def test_messages_are_one_line_whatever_the_path(torch, files, capsys):
    deep = files / ("a-long-folder-name-" * 4) / "measured.csv"
    argv = ["replay", str(files / "inst.json"), str(files / "sched.json"), "--out", str(deep), *FAST]
    assert main(argv) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wrote the replay table") and err[0].endswith(".json")


def test_profile_never_writes_into_the_bundled_examples(torch, monkeypatch, capsys):
    import kvsched.executor.profile as prof

    monkeypatch.setattr(prof, "run_profile", lambda *a, **k: pytest.fail("profiled"))
    before = sorted(p.name for p in EXAMPLES_DIR.iterdir())
    assert main(["profile", "--out", str(EXAMPLES_DIR), "--grid", "quick", *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bundled examples" in err[0]
    assert sorted(p.name for p in EXAMPLES_DIR.iterdir()) == before


def test_profile_never_overwrites_its_cost_model_file(torch, tmp_path, monkeypatch, capsys):
    import kvsched.executor.profile as prof
    from kvsched.costmodel.coeffile import shipped

    monkeypatch.setattr(prof, "run_profile", lambda *a, **k: pytest.fail("profiled"))
    coefficients = tmp_path / "batches.json"
    coefficients.write_bytes(shipped()[SHIPPED].read_bytes())
    argv = ["profile", "--out", str(tmp_path), "--cost-model", str(coefficients), *FAST]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "also an input" in err[0]
    assert main(["profile", "--out", str(coefficients), *FAST]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_profile_files_are_what_the_profile_writes(torch, tmp_path):
    from kvsched.commands.executor import PROFILE_FILES
    from kvsched.executor.measure import sidecar
    from kvsched.executor.model import Decoder, decoder_config
    from kvsched.executor.profile import GRIDS, run_profile

    res = run_profile(Decoder(decoder_config("tiny")), tmp_path, grid=GRIDS["quick"], repeat=1, warmup=0)
    written = {res.compute.name, res.attention.name, res.batches.name, sidecar(res.batches).name}
    assert written == set(PROFILE_FILES) == {p.name for p in tmp_path.iterdir()}


def test_weights_larger_than_free_memory_are_one_error(torch, monkeypatch):
    import kvsched.executor.device as dev
    from kvsched.executor.model import Decoder, decoder_config

    monkeypatch.setattr(dev, "free_memory", lambda device: 10**8)
    # One layer of Llama-2-7B's shape: 0.5 GB of embedding and head and 0.8 GB of layer in float32.
    with pytest.raises(
        InputError, match=r"--model llama-2-7b-shape \(1 layers in float32\) needs .* --layers"
    ):
        Decoder(decoder_config("llama-2-7b-shape", layers=1))


def test_a_failed_weight_allocation_is_one_error(torch, monkeypatch):
    from kvsched.executor.model import Decoder, decoder_config

    def fail(self, cfg):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(Decoder, "_build", fail)
    with pytest.raises(InputError, match="cannot be allocated on cpu"):
        Decoder(decoder_config("tiny"))


def test_a_pool_larger_than_free_memory_is_one_error(torch, files, monkeypatch, capsys):
    import kvsched.executor.device as dev

    monkeypatch.setattr(dev, "free_memory", lambda device: 10**8)
    # 10**6 tokens of the tiny model: 0.5 GB.
    assert _replay(files, "--pool-capacity", str(10**6)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("kvsched replay: error: KV pool: 1,000,000 tokens needs 0.5 GB")
    assert "--pool-capacity" in err[-1]


def test_a_table_onto_a_device_writes_no_metadata_beside_it(torch, files, capsys):
    # -o /dev/null wrote /dev/null.json, a new file in /dev. Here through a link (the same device, without
    # touching /dev when the metadata is written anyway): its .json would be a file beside the link.
    link = files / "out.csv"
    link.symlink_to("/dev/null")
    argv = ["replay", str(files / "inst.json"), str(files / "sched.json"), "--out", str(link), *FAST]
    assert main(argv) == 0
    assert not (files / "out.json").exists() and link.is_symlink()
    wrote = [line for line in capsys.readouterr().err.splitlines() if line.startswith("wrote")]
    assert len(wrote) == 1 and "its metadata was not written" in wrote[0], wrote
    from kvsched.executor.measure import output_sidecar

    assert output_sidecar("/dev/null") is None and output_sidecar("/dev/stdout") is None
    assert output_sidecar(files / "m.csv") == files / "m.json"
