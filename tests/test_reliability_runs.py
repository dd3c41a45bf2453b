"""What training, generation and scaling out promise when a run goes wrong, one test a promise.

Each case was found by trying what learners do (two runs in one folder, a kill at the wrong
moment, a full disk, a cut log, a long sample stopped with Ctrl-C). Nothing here waits or fills
a disk for real: failures are simulated with monkeypatch, on runs of a few tiny steps.
"""

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, replace

import pytest
import torch

import tiny_llm.checkpoint as checkpoint_module
import tiny_llm.generate as generate_module
import tiny_llm.processes as processes_module
import tiny_llm.scale as scale_module
import tiny_llm.train as train_module
from tiny_llm.budget import Budget
from tiny_llm.checkpoint import load_checkpoint, read_log, save_checkpoint
from tiny_llm.evaluate import read_log as evaluate_read_log
from tiny_llm.generate import complete, printable, stream_sample
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.processes import LOCK_NAME, FolderInUse, hold_run_folder
from tiny_llm.scale import one_line_per_failure
from tiny_llm.tokenize import EOT, load_tokenizer, tokenizer_sha256
from tiny_llm.train import TrainConfig, train


def config(data_dir, out, **changes):
    """A run small enough to repeat in every test: 2 steps of 2 windows, saved at each."""
    cfg = TrainConfig(preset="tiny", max_steps=2, batch_size=2, warmup_steps=1, eval_interval=1,
                      eval_iters=1, data_dir=str(data_dir), out=str(out), device="cpu",
                      time_budget=0)
    return replace(cfg, **changes)


def steps_in_log(out):
    return [r["step"] for r in read_log(out / "log.jsonl")]


@pytest.fixture(scope="module")
def saved_run(sample_data_dir, tmp_path_factory):
    """A finished 2-step run; tests that change it work on a copy (copy_run)."""
    out = tmp_path_factory.mktemp("saved") / "run"
    train(config(sample_data_dir, out))
    return out


def copy_run(saved_run, tmp_path):
    return shutil.copytree(saved_run, tmp_path / "run")


def dead_pid():
    """The PID of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- training ---

@pytest.mark.parametrize("flag, value", [("preset", "small"), ("model", "modern"),
                                         ("optimizer", "adamw"), ("dropout", 0.1)])
def test_resume_refuses_a_setting_the_checkpoint_fixes(saved_run, sample_data_dir, flag, value):
    before = (saved_run / "ckpt.pt").read_bytes()
    cfg = config(sample_data_dir, saved_run, resume=True, max_steps=3, **{flag: value})
    with pytest.raises(ValueError, match=rf"cannot change what the run in .* fixed: --{flag} "
                                         rf"{value} \(the run has .*\)\. "
                                         r".*it accepts --time-budget, --max-steps, --out,"):
        train(cfg)
    assert (saved_run / "ckpt.pt").read_bytes() == before  # nothing saved, least of all a lie


def test_resume_on_the_command_line_names_the_flags_it_accepts(saved_run, sample_data_dir,
                                                               monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train", "--resume", "--out", str(saved_run), "--preset",
                                      "small", "--max-steps", "3", "--sample-tokens", "0"])
    with pytest.raises(SystemExit, match=r"--preset small \(the run has tiny\).*With --resume, "
                                         r"leave out --model, --preset.*accepts --time-budget"):
        train_module.main()
    assert load_checkpoint(saved_run / "ckpt.pt")["train_config"]["preset"] == "tiny"


def test_resume_refuses_another_vocabulary(saved_run, sample_data_dir, tmp_path):
    ckpt = load_checkpoint(saved_run / "ckpt.pt")
    other = {**ckpt, "tokenizer_sha256": "0" * 64,
             "config": {**ckpt["config"], "vocab_size": ckpt["config"]["vocab_size"] + 1}}
    save_checkpoint(tmp_path / "ckpt.pt", other)
    with pytest.raises(ValueError, match="different tokenizer"):
        train(config(sample_data_dir, tmp_path, resume=True, max_steps=3))


def test_a_second_run_on_the_same_folder_is_refused_and_names_the_process(sample_data_dir,
                                                                          tmp_path):
    with hold_run_folder(tmp_path / "run"):  # as a run in this process would hold it
        with pytest.raises(FolderInUse, match=rf"in use by process {os.getpid()}, another "
                                              r"training run.*pass another --out"):
            train(config(sample_data_dir, tmp_path / "run"))
    assert not (tmp_path / "run" / "ckpt.pt").exists()


def test_the_lock_is_created_atomically_with_the_pid(tmp_path, monkeypatch):
    opened = []
    real_open = os.open
    monkeypatch.setattr(processes_module.os, "open",
                        lambda path, flags, *a: opened.append(flags) or real_open(path, flags, *a))
    with hold_run_folder(tmp_path) as lock:
        assert lock.read_text() == f"{os.getpid()}\n"
    assert opened[0] & os.O_EXCL and opened[0] & os.O_CREAT
    assert not lock.exists()


def test_a_stale_lock_from_a_killed_run_is_taken_over(sample_data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    pid = dead_pid()
    (out / LOCK_NAME).write_text(f"{pid}\n")
    assert train(config(sample_data_dir, out))["step"] == 2
    assert f"was left by process {pid}, which has ended" in capsys.readouterr().err
    assert not (out / LOCK_NAME).exists()


def test_the_lock_is_held_for_the_run_and_removed_after_ctrl_c(sample_data_dir, tmp_path,
                                                               monkeypatch):
    out, seen = tmp_path / "run", []

    def second_ctrl_c(*args, **kwargs):  # the loop's Ctrl-C handler is gone: it interrupts
        seen.append((out / LOCK_NAME).read_text())
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "update_weights", second_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        train(config(sample_data_dir, out))
    assert seen == [f"{os.getpid()}\n"]
    assert not (out / LOCK_NAME).exists()


def test_a_read_only_out_is_found_before_any_work(sample_data_dir, tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args):  # the course's tests run as root: chmod would not do
        if str(path).startswith(str(tmp_path)) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(processes_module.os, "open", read_only)
    monkeypatch.setattr(train_module, "ensure_data", lambda *a: pytest.fail("data was read"))
    with pytest.raises(PermissionError, match=r"cannot write to the run folder .*run \(Read-only"
                                              r" file system\).*pass an --out you can write to"):
        train(config(sample_data_dir, tmp_path / "run"))


def test_a_run_that_cannot_start_leaves_no_folder_behind(sample_data_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        train(config(sample_data_dir, tmp_path / "typo", resume=True))
    assert not (tmp_path / "typo").exists()


def test_a_budget_shorter_than_the_warmup_says_what_happens(capsys):
    cfg = TrainConfig(time_budget=1, warmup_steps=100, max_steps=0)
    records = [{"step": 0, "time_s": 0.0, "eval_s": 0.2}]
    records += [{"step": s, "time_s": 0.05 * s} for s in range(1, 11)]  # 50 ms a step
    budget = Budget(cfg, records[:1], 0)
    cfg = budget.price(cfg, 10, records)  # 10 + (1 - 0.5 - 0.2) / 0.051 steps:
    assert budget.plan == cfg.max_steps == 15 and cfg.warmup_steps == 10
    assert ("1 s is too short for the 100-step warmup: the warmup shrinks to 10 steps of the "
            "15, so the learning rate still comes down. Give a longer "
            "--time-budget or fewer --warmup-steps") in capsys.readouterr().out


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1536 vs 1024"),
])
def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(sample_data_dir, tmp_path,
                                                                monkeypatch, failure):
    out, real_save, calls = tmp_path / "run", torch.save, []

    def save_then_fill_the_disk(state, path):
        calls.append(path)
        if len(calls) == 1:
            return real_save(state, path)
        path.write_bytes(b"PK\x03\x04 half a checkpoint")
        raise failure

    monkeypatch.setattr(checkpoint_module.torch, "save", save_then_fill_the_disk)
    with pytest.raises(OSError, match=r"could not save step 2 in .*run: the disk is full\. "
                                      r".*ckpt.pt still holds the previous save, whole\. Free "
                                      r"some space, then continue with: uv run python -m "
                                      r"tiny_llm.train --resume --out .*run"):
        train(config(sample_data_dir, out))
    assert load_checkpoint(out / "ckpt.pt")["step"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.pt", "log.jsonl"]  # no half files


class Killed(BaseException):
    """A kill -9 as a test can have it: nothing after it runs (except cleanups)."""


def test_a_kill_between_the_log_and_checkpoint_writes_loses_no_record(sample_data_dir,
                                                                      tmp_path, monkeypatch):
    out, real_atomic_path, writes = tmp_path / "run", checkpoint_module.atomic_path, []

    def killed_at_the_fourth_write(path):  # save 1 writes 2 files; save 2's second write dies
        writes.append(path)
        if len(writes) == 4:
            raise Killed
        return real_atomic_path(path)

    monkeypatch.setattr(checkpoint_module, "atomic_path", killed_at_the_fourth_write)
    with pytest.raises(Killed):
        train(config(sample_data_dir, out, max_steps=3, lr_decay_steps=3))
    monkeypatch.undo()
    train(config(sample_data_dir, out, max_steps=3, lr_decay_steps=3, resume=True))
    assert steps_in_log(out) == [0, 1, 2, 3]  # step 2's record was not lost, nor doubled


def test_resume_skips_a_cut_last_line_of_the_log_with_a_notice(saved_run, sample_data_dir,
                                                                tmp_path, capsys):
    out = copy_run(saved_run, tmp_path)
    log = out / "log.jsonl"
    log.write_text(log.read_text()[:-20])  # the last record cut short, as a copy stopped midway
    train(config(sample_data_dir, out, resume=True, max_steps=3))
    assert f"the last line of {log} is cut short" in capsys.readouterr().err
    assert steps_in_log(out) == [0, 1, 2, 3]  # the cut record came back from the checkpoint


def test_evaluate_reads_a_cut_log_and_names_a_broken_one(saved_run, tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    lines = (saved_run / "log.jsonl").read_text().splitlines()
    log.write_text("\n".join(lines)[:-20])
    assert [r["step"] for r in evaluate_read_log(log)] == [0, 1]
    assert f"the last line of {log} is cut short" in capsys.readouterr().err
    log.write_text("\n".join([lines[0], lines[1][:30], lines[2]]))
    with pytest.raises(ValueError, match=r"log.jsonl, line 2, is not a JSON record .*the "
                                         r"checkpoint beside it is not affected"):
        evaluate_read_log(log)


def test_ctrl_c_prints_the_whole_command_that_resumes_the_run(sample_data_dir, tmp_path,
                                                              monkeypatch):
    real_update = train_module.update_weights

    def update_then_ctrl_c(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # the loop finishes this step, saves, and stops
        return real_update(*args, **kwargs)

    monkeypatch.setattr(train_module, "update_weights", update_then_ctrl_c)
    monkeypatch.chdir(tmp_path)  # --preset tiny without --out trains in runs/tiny
    monkeypatch.setattr(sys, "argv", ["train", "--preset", "tiny", "--max-steps", "3",
                                      "--batch-size", "2", "--eval-iters", "1", "--device", "cpu",
                                      "--data-dir", str(sample_data_dir)])
    with pytest.raises(SystemExit, match=r"stopped by Ctrl-C at step 1, .*continue with:\n  "
                                         r"uv run python -m tiny_llm.train --resume --out "
                                         r"runs/tiny$"):
        train_module.main()


# --- generation ---

@pytest.fixture(scope="module")
def writer(sample_data_dir):
    """An untrained tiny GPT with the sample corpus's tokenizer: it writes byte soup, which
    splits characters across tokens, the hard case for printing while generating."""
    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    torch.manual_seed(0)
    return GPT(replace(PRESETS["tiny"], vocab_size=tokenizer.get_vocab_size())).eval(), tokenizer


def test_a_sample_is_printed_while_it_is_made(writer, monkeypatch):
    model, tokenizer = writer
    made, printed = [], []
    real_generate = generate_module.generate

    def counted(*args, **kwargs):
        made.append(1)
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(generate_module, "generate", counted)
    stream_sample(model, tokenizer, "Once", 40, lambda t: printed.append((len(made), t)),
                  torch.Generator().manual_seed(3), temperature=2.0)
    made_before = [n for n, _ in printed]  # how many tokens existed at each write
    assert made_before[0] == 0 and made_before[1] <= 3  # the prompt first, then token by token
    assert len(printed) > 20  # (a token holding half a character waits for the other half)
    monkeypatch.undo()
    whole = complete(model, tokenizer, "Once", 40, torch.Generator().manual_seed(3),
                     temperature=2.0)
    assert "".join(t for _, t in printed) == printable(whole)  # the same text, piece by piece


def test_ctrl_c_keeps_what_was_made_and_exits_130(sample_data_dir, monkeypatch, capsys):
    real_sample_tokens = generate_module.sample_tokens

    def ctrl_c_at_the_sixth_token(*args, **kwargs):  # the command samples through this
        for made, token in enumerate(real_sample_tokens(*args, **kwargs), 1):
            if made == 6:
                raise KeyboardInterrupt
            yield token

    monkeypatch.setattr(generate_module, "sample_tokens", ctrl_c_at_the_sixth_token)
    monkeypatch.setattr(sys, "argv", ["generate", "--max-new-tokens", "1000", "--temperature",
                                      "0", "--data-dir", str(sample_data_dir)])
    with pytest.raises(SystemExit) as stopped:
        generate_module.main()
    out, err = capsys.readouterr()
    assert stopped.value.code == 130
    assert "sample 1     Once upon a time time time time time time\n" in out  # 5 tokens kept
    assert "stopped by Ctrl-C" in err and "Traceback" not in err


def test_control_characters_in_a_prompt_are_escaped_when_echoed(sample_data_dir, monkeypatch,
                                                                capsys):
    monkeypatch.setattr(sys, "argv", ["generate", "--prompt", "Hi\x1b[2J\x07 there\r\n",
                                      "--max-new-tokens", "0", "--data-dir",
                                      str(sample_data_dir)])
    generate_module.main()
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "sample 1     Hi\\x1b[2J\\x07 there\\r\n" in out


# --- scale ---

def test_a_failing_rank_prints_one_line_naming_it_first(capsys):
    with pytest.raises(SystemExit) as stopped, one_line_per_failure(1):
        raise PermissionError("cannot write to the run folder /ro/run (Read-only file system)")
    assert stopped.value.code == 1
    assert capsys.readouterr().err == ("rank 1: error: cannot write to the run folder /ro/run "
                                       "(Read-only file system)\n")


def test_a_rank_that_lost_a_failed_peer_says_so_in_one_line(capsys):
    with pytest.raises(SystemExit), one_line_per_failure(0):
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:561] Connection closed by peer "
                           "[127.0.0.1]:29500. This is typically caused by a remote worker "
                           "crashing")
    assert capsys.readouterr().err == ("rank 0: stopped: another rank has failed (its error is "
                                       "above)\n")


def test_an_unexpected_error_on_a_rank_prints_its_line_then_its_traceback(capsys):
    with pytest.raises(KeyError), one_line_per_failure(1):
        raise KeyError("embed.tok_emb.weight")
    assert capsys.readouterr().err == "rank 1: KeyError: 'embed.tok_emb.weight'\n"


def test_the_scale_command_prints_a_ranks_error_as_one_line(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(sys, "argv", ["scale", "--resume", "--out", "/no/such/run"])
    with pytest.raises(SystemExit):
        scale_module.main.__wrapped__()  # without @record, whose fault handler needs a file
    err = capsys.readouterr().err
    assert err.startswith("rank 1: error: no checkpoint at /no/such/run/ckpt.pt")
    assert err.count("\n") == 1


# --- the second probe (issue 26) ---------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_finish_the_step_save_and_say_so(sample_data_dir, tmp_path,
                                                            monkeypatch, signum):
    real_update = train_module.update_weights

    def not_handled(*args):  # what the signal would do unhandled: end the program, unsaved
        raise AssertionError(f"{signal.Signals(signum).name} was not handled")

    def update_then_signal(*args, **kwargs):
        signal.raise_signal(signum)  # a scheduler's kill, a closed terminal
        return real_update(*args, **kwargs)

    previous = signal.signal(signum, not_handled)
    try:
        monkeypatch.setattr(train_module, "update_weights", update_then_signal)
        monkeypatch.setattr(sys, "argv", ["train", "--preset", "tiny", "--max-steps", "3",
                                          "--batch-size", "2", "--eval-iters", "1", "--device",
                                          "cpu", "--data-dir", str(sample_data_dir), "--out",
                                          str(tmp_path / "run"), "--sample-tokens", "0"])
        name = signal.Signals(signum).name
        with pytest.raises(SystemExit, match=rf"stopped by {name} at step 1, saved .*ckpt.pt; "
                                             r"continue with:\n  uv run python -m tiny_llm"):
            train_module.main()
        assert signal.getsignal(signum) is not_handled  # put back after the loop
    finally:
        signal.signal(signum, previous)
    assert load_checkpoint(tmp_path / "run" / "ckpt.pt")["step"] == 1


def test_a_batch_too_large_for_memory_is_refused_before_the_first_step(sample_data_dir, tmp_path,
                                                                        monkeypatch):
    import tiny_llm.device as device_module

    monkeypatch.setattr(device_module, "memory_bytes", lambda device: 1_000_000)  # a 1 MB machine
    monkeypatch.setattr(train_module, "update_weights", lambda *a, **k: pytest.fail("a step ran"))
    with pytest.raises(ValueError, match=r"--batch-size 2 needs about .* GB for one micro-batch "
                                         r"of 2 x 64 tokens.*lower --batch-size .* and raise "
                                         r"--grad-accum \(now 1\)"):
        train(config(sample_data_dir, tmp_path / "run"))
    assert not (tmp_path / "run" / "ckpt.pt").exists()


def test_the_memory_estimate_lets_the_course_runs_through():
    import tiny_llm.device as device_module
    from tiny_llm.modern import PRESETS as MODERN

    for preset in (PRESETS["cpu"], MODERN["cpu"]):  # the CPU's main job: well under 1 GB
        assert device_module.activation_bytes(preset, 16) < 1e9
    assert device_module.activation_bytes(PRESETS["gpu"], 16) < 8e9  # the smallest GPUs' memory


def test_a_full_disk_at_the_first_save_does_not_offer_a_resume(sample_data_dir, tmp_path,
                                                               monkeypatch):
    def full(state, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module.torch, "save", full)
    with pytest.raises(OSError) as failed:
        train(config(sample_data_dir, tmp_path / "run"))
    message = str(failed.value)
    assert "Nothing was saved before, so there is nothing to resume" in message
    assert "--resume" not in message


def saved_with(saved_run, tmp_path, edit):
    """A copy of the saved run whose checkpoint `edit(state)` changed."""
    out = copy_run(saved_run, tmp_path)
    state = torch.load(out / "ckpt.pt", weights_only=True)
    edit(state)
    torch.save(state, out / "ckpt.pt")
    return out


def resume_main(out, monkeypatch, *flags):
    monkeypatch.setattr(sys, "argv", ["train", "--resume", "--out", str(out), "--max-steps", "3",
                                      "--sample-tokens", "0", *flags])
    train_module.main()


@pytest.mark.parametrize("key", ["optimizer", "rng", "train_config"])
def test_resume_of_a_checkpoint_without_training_state_says_so(saved_run, sample_data_dir,
                                                              tmp_path, monkeypatch, key):
    out = saved_with(saved_run, tmp_path, lambda s: s.pop(key))
    with pytest.raises(SystemExit, match=rf"ckpt.pt has no training state to resume \({key} "
                                         r"missing\): it holds a model without a run"):
        resume_main(out, monkeypatch)
    with pytest.raises(ValueError, match="no training state to resume"):  # the library too
        train(config(sample_data_dir, out, resume=True, max_steps=3))


def test_resume_of_an_imported_checkpoint_says_it_holds_weights_only(saved_run, tmp_path,
                                                                    monkeypatch):
    def as_an_import_writes(state):
        for key in ("optimizer", "rng", "train_config", "data_position", "last_record"):
            state.pop(key)
        state["data_source"] = "imported from gpt2"

    out = saved_with(saved_run, tmp_path, as_an_import_writes)
    with pytest.raises(SystemExit, match=r"no training state to resume \(optimizer, rng, "
                                         r"train_config missing\): it was imported from gpt2 "
                                         r"\(tiny_llm.export --import\), which writes weights"):
        resume_main(out, monkeypatch)


def test_resume_refuses_a_training_setting_it_does_not_know_and_fills_a_new_one(
        saved_run, tmp_path, monkeypatch):
    out = saved_with(saved_run, tmp_path, lambda s: s["train_config"].update(warp_factor=8))
    with pytest.raises(SystemExit, match=r"has the training settings warp_factor, which this "
                                         r"tiny-llm does not know"):
        resume_main(out, monkeypatch)
    # a LoRA run whose adapters were cut out of the file is refused by name, not a KeyError
    out = saved_with(saved_run, tmp_path / "lora", lambda s: s["train_config"].update(
        lora_rank=8, init_from=None, requests=None, lora_alpha=16.0))
    from tiny_llm import instruct
    with pytest.raises(SystemExit, match=r"was a LoRA run \(lora_rank 8\) but holds no "
                                         r"'adapters' to resume"):
        instruct.main(["train", "--resume", "--out", str(out), "--max-steps", "3",
                       "--sample-tokens", "0"])
    # a setting added to TrainConfig after the run was saved takes its default
    out = saved_with(saved_run, tmp_path / "b", lambda s: s["train_config"].pop("cooldown"))
    resume_main(out, monkeypatch)
    assert load_checkpoint(out / "ckpt.pt")["step"] == 3


def test_resume_after_the_data_folder_moved_names_it_and_never_prepares(
        saved_run, sample_data_dir, tmp_path, monkeypatch, capsys):
    import tiny_llm.data as data_module

    gone = str(tmp_path / "moved-away")
    out = saved_with(saved_run, tmp_path, lambda s: s["train_config"].update(data_dir=gone))
    monkeypatch.setattr(data_module, "prepare_data", lambda *a, **k: pytest.fail("prepared"))
    monkeypatch.delenv("TINY_LLM_DATA_DIR", raising=False)
    with pytest.raises(SystemExit, match=r"the run's data folder .*moved-away holds no prepared "
                                         r"data any more .*--data-dir NEW \(or the environment "
                                         r"variable TINY_LLM_DATA_DIR=NEW\)"):
        resume_main(out, monkeypatch)
    assert not (tmp_path / "moved-away").exists()
    monkeypatch.setenv("TINY_LLM_DATA_DIR", str(sample_data_dir))  # where it is now
    resume_main(out, monkeypatch)
    assert "moved-away is gone: using TINY_LLM_DATA_DIR" in capsys.readouterr().err
    assert load_checkpoint(out / "ckpt.pt")["step"] == 3


def test_a_token_file_with_ids_beyond_the_vocabulary_is_named_corrupt(sample_data_dir, tmp_path):
    data = shutil.copytree(sample_data_dir, tmp_path / "data")
    ids = torch.from_numpy(load_token_array_copy(data / "train.bin"))
    ids[100] = 60000
    (data / "train.bin").write_bytes(ids.numpy().astype("uint16").tobytes())
    with pytest.raises(ValueError, match=r"train.bin holds token id 60,000, beyond the [\d,]+ "
                                         r"ids of its tokenizer: the file is corrupt"):
        train(config(data, tmp_path / "run"))


def load_token_array_copy(path):
    import numpy as np

    return np.fromfile(path, dtype=np.uint16).astype("int32")


def test_a_corpus_shorter_than_the_context_is_refused_naming_a_real_flag(tmp_path, monkeypatch):
    from tiny_llm.data import prepare_data
    from tiny_llm.tokenize import EOT

    (tmp_path / "two.txt").write_text(f"Tom ran home.\n{EOT}\nAnn sat down and smiled.\n")
    prepare_data(tmp_path / "two.txt", data_dir=tmp_path / "d", vocab_size=300, progress=False)
    with pytest.raises(ValueError, match=r"seq_len=64 needs at least 65 tokens, the data has "
                                         r"\d+: prepare more stories .*--valid-stories.*--preset "
                                         r"tiny"):
        train(config(tmp_path / "d", tmp_path / "run"))


# --- issue 36: step 17's settings are fixed on resume ---

from tiny_llm.instruct import RequestConfig, RequestHooks  # noqa: E402
from tiny_llm.instruct import main as instruct_main  # noqa: E402


@pytest.fixture(scope="module")
def tuned_runs(saved_run, sample_data_dir, tmp_path_factory):
    """A LoRA fine-tuning (rank 2, alpha 4) and a full one of saved_run, 2 steps each."""
    folder = tmp_path_factory.mktemp("tuned")
    records = folder / "requests.txt"  # a few records: quicker than deriving from every story
    records.write_text("".join(f"Words: dog, sun\nStory:\nThe dog saw the sun {i}.\n{EOT}\n"
                               for i in range(8)))
    base = dict(init_from=str(saved_run / "ckpt.pt"), requests=str(records), lr=1e-3)
    tuned = lambda out, **more: RequestConfig(**{**asdict(config(sample_data_dir, out)),  # noqa: E731
                                                 **base, **more})
    train(tuned(folder / "lora", lora_rank=2, lora_alpha=4.0, optimizer="adamw"),
          hooks=RequestHooks())
    train(tuned(folder / "full"), hooks=RequestHooks())
    return folder


@pytest.mark.parametrize("run, flags, says", [
    ("lora", ["--lora-alpha", "64"], r"--lora-alpha 64.0 \(the run has 4.0\)"),
    ("lora", ["--lora-rank", "8"], r"--lora-rank 8 \(the run has 2\)"),
    ("lora", ["--lora-rank", "0"], r"--lora-rank 0 \(the run has 2\)"),
    ("full", ["--lora-rank", "4"], r"--lora-rank 4 \(the run has 0\)"),
    ("full", ["--requests", "other.txt"], r"--requests other.txt \(the run has .*requests.txt\)"),
    ("full", ["--init-from", "runs/x/ckpt.pt"], r"--init-from runs/x/ckpt.pt \(the run has "),
])
def test_resume_refuses_to_change_step_17s_settings_in_one_line(tuned_runs, monkeypatch, run,
                                                                flags, says):
    out = tuned_runs / run
    before = (out / "ckpt.pt").read_bytes()
    with pytest.raises(SystemExit, match=rf"^error: --resume cannot change what the run in .* "
                                         rf"fixed: {says}.*leave out .*--lora-rank, --lora-alpha"):
        instruct_main(["train", "--resume", "--out", str(out), "--max-steps", "3",
                       "--sample-tokens", "0", *flags])
    assert (out / "ckpt.pt").read_bytes() == before
    saved = load_checkpoint(out / "ckpt.pt")["train_config"]
    assert (saved["lora_rank"], saved["lora_alpha"]) == ((2, 4.0) if run == "lora" else (0, 16.0))


def fine_tune_main(monkeypatch, *flags):
    instruct_main(["train", "--max-steps", "1", "--batch-size", "2", "--eval-iters", "1",
                   "--warmup-steps", "1", "--time-budget", "0", "--device", "cpu",
                   "--sample-tokens", "0", *flags])


def test_init_from_takes_a_run_folder_and_records_the_model_it_trains(saved_run, sample_data_dir,
                                                                     tmp_path, monkeypatch,
                                                                     capsys):
    fine_tune_main(monkeypatch, "--init-from", str(saved_run), "--out", str(tmp_path / "ft"),
                   "--data-dir", str(sample_data_dir), "--preset", "tiny")  # its own: taken
    saved = load_checkpoint(tmp_path / "ft" / "ckpt.pt")["train_config"]
    assert (saved["model"], saved["preset"]) == ("gpt", "tiny")  # the base's, not the default cpu
    assert "model        tiny," in capsys.readouterr().out


@pytest.mark.parametrize("flags, shown", [
    (["--preset", "gpu"], "--preset gpu (it has tiny)"),
    (["--model", "modern", "--preset", "gpu"],
     "--model modern (it has gpt), --preset gpu (it has tiny)"),
    (["--model", "modern", "--qk-norm"],
     "--model modern (it has gpt), --qk-norm True (it has False)"),
])
def test_init_from_refuses_flags_that_choose_another_model(saved_run, sample_data_dir, tmp_path,
                                                           monkeypatch, flags, shown):
    with pytest.raises(SystemExit, match=rf"^error: --init-from fine-tunes the model in .* as it "
                                         rf"is: leave out {re.escape(shown)}$"):
        fine_tune_main(monkeypatch, "--init-from", str(saved_run), "--out", str(tmp_path / "ft"),
                       "--data-dir", str(sample_data_dir), *flags)
    assert not (tmp_path / "ft").exists()


def test_a_lora_rank_wider_than_the_model_is_refused_before_a_step(saved_run, sample_data_dir,
                                                                 tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match=r"^error: --lora-rank 100000 is more than the narrowest "
                                         r"matrix it adapts, 64 wide"):
        fine_tune_main(monkeypatch, "--init-from", str(saved_run), "--out", str(tmp_path / "ft"),
                       "--data-dir", str(sample_data_dir), "--lora-rank", "100000",
                       "--optimizer", "adamw")
    assert not (tmp_path / "ft" / "ckpt.pt").exists()


# --- the fourth probe (issue 45): step 18's loop inside step 10's loop shell ------------------

import tiny_llm.reward as reward_module  # noqa: E402
from tiny_llm.loop_shell import LoopShell  # noqa: E402
from tiny_llm.reward import RewardConfig, train_reward  # noqa: E402


@pytest.fixture(scope="module")
def reward_start(sample_data_dir, tmp_path_factory):
    """A tiny untrained GPT saved as a checkpoint that says it takes requests."""
    return save_start(tmp_path_factory.mktemp("start") / "ckpt.pt", sample_data_dir, seed=0)


def save_start(path, data_dir, seed):
    tokenizer_file = data_dir / "tokenizer.json"
    torch.manual_seed(seed)
    model = GPT(replace(PRESETS["tiny"], vocab_size=load_tokenizer(tokenizer_file)
                        .get_vocab_size()))
    save_checkpoint(path, {"model": model.state_dict(), "config": asdict(model.config),
                           "step": 30, "tokenizer_sha256": tokenizer_sha256(tokenizer_file),
                           "data_source": "sample", "train_config": {"requests": "derived"}})
    return path


def reward_flags(start, data_dir, out, *more):
    return ["--init-from", str(start), "--max-steps", "3", "--time-budget", "0",
            "--group-size", "2", "--requests-per-step", "1", "--max-new-tokens", "4",
            "--data-dir", str(data_dir), "--out", str(out), "--device", "cpu", *more]


def reward_cfg(start, data_dir, out, **changes):
    cfg = RewardConfig(init_from=str(start), max_steps=2, time_budget=0, group_size=2,
                       requests_per_step=1, max_new_tokens=4, data_dir=str(data_dir),
                       out=str(out), device="cpu")
    return replace(cfg, **changes)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_a_stop_signal_in_the_reward_step_finishes_the_update_saves_and_says_so(
        reward_start, sample_data_dir, tmp_path, monkeypatch, signum):
    real_step = reward_module.reward_step

    def not_handled(*args):  # what the signal would do unhandled: end the program, unsaved
        raise AssertionError(f"{signal.Signals(signum).name} was not handled")

    def step_then_signal(*args, **kwargs):
        signal.raise_signal(signum)
        return real_step(*args, **kwargs)

    previous = signal.signal(signum, not_handled)
    try:
        monkeypatch.setattr(reward_module, "reward_step", step_then_signal)
        name = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}[signum]
        with pytest.raises(SystemExit, match=rf"stopped by {name} at step 1, saved .*ckpt.pt; "
                                             r"continue with:\n  uv run python -m "
                                             r"tiny_llm.reward --resume --out "):
            reward_module.main(reward_flags(reward_start, sample_data_dir, tmp_path / "r"))
        assert signal.getsignal(signum) is not_handled  # put back after the loop
    finally:
        signal.signal(signum, previous)
    assert load_checkpoint(tmp_path / "r" / "ckpt.pt")["step"] == 1  # the update was kept


def test_a_reward_resume_refuses_a_start_replaced_or_moved_and_keeps_its_record(
        reward_start, sample_data_dir, tmp_path):
    start = shutil.copy(reward_start, tmp_path / "start.pt")
    cfg = reward_cfg(start, sample_data_dir, tmp_path / "r", max_steps=1)
    train_reward(cfg)
    record = load_checkpoint(tmp_path / "r" / "ckpt.pt")["train_config"]
    save_start(tmp_path / "start.pt", sample_data_dir, seed=1)  # step 17 run again, say
    with pytest.raises(ValueError, match=r"start.pt is not the file the reward run in .* started "
                                         r"from: that was sha256 .*; was step 17 run again"):
        train_reward(replace(cfg, max_steps=2, resume=True))
    moved = shutil.copy(reward_start, tmp_path / "moved.pt")
    (tmp_path / "start.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"started from .*start.pt, which is not there "
                                                r"any more: put it back, or pass --init-from"):
        train_reward(replace(cfg, max_steps=2, resume=True), given={"max_steps", "resume"})
    records = train_reward(replace(cfg, init_from=str(moved), max_steps=2, resume=True),
                           given={"init_from", "max_steps", "resume"})  # the same file, moved
    assert [r["step"] for r in records] == [1, 2]
    assert load_checkpoint(tmp_path / "r" / "ckpt.pt")["train_config"] == record


def test_a_diverging_reward_run_stops_before_the_update_and_keeps_the_good_save(
        reward_start, sample_data_dir, tmp_path, monkeypatch):
    real_loss, calls = reward_module.grpo_loss, []

    def nan_at_the_third(*args):
        loss, kl = real_loss(*args)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 3 else loss), kl

    monkeypatch.setattr(reward_module, "grpo_loss", nan_at_the_third)
    out = tmp_path / "r"
    with pytest.raises(FloatingPointError, match=r"the training loss became nan at step 3: the "
                                                 r"run diverged. Try a lower --lr"):
        train_reward(reward_cfg(reward_start, sample_data_dir, out, max_steps=4,
                                save_interval=2))
    saved = load_checkpoint(out / "ckpt.pt")
    assert saved["step"] == 2 and all(torch.isfinite(w).all() for w in saved["model"].values())
    shell = LoopShell(TrainConfig(max_steps=2, time_budget=0), [], 0, 1, True)
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    with pytest.raises(FloatingPointError, match="no longer finite numbers after step 7"):
        shell.check_weights(model, 7)


@pytest.mark.parametrize("flags, said", [
    (["--kl-coef", "nan"], "--kl-coef must be a number >= 0 (0: no KL term; the default 0.1 "
                           "keeps the model near its start): got nan"),
    (["--kl-coef", "-5"], "--kl-coef must be a number >= 0"),
    (["--save-interval", "0"], "--save-interval >= 1 update and --max-steps >= 0; got 4, 0, 3"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1 (a story of no tokens"),
    (["--max-steps", "0"], "give the run a length: --max-steps N, or --time-budget like 10m "
                           "(got --max-steps 0 and --time-budget 0)"),
], ids=["kl-nan", "kl-negative", "save-interval-0", "max-new-tokens-0", "no-length"])
def test_reward_flags_that_cannot_work_are_refused_with_the_value_and_the_fix(
        reward_start, sample_data_dir, tmp_path, capsys, flags, said):
    with pytest.raises(SystemExit):
        reward_module.main(reward_flags(reward_start, sample_data_dir, tmp_path / "r", *flags))
    assert said in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_reward_plot_and_resume_without_a_reward_run_say_what_is_needed(
        saved_run, reward_start, sample_data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"error: .*ckpt.pt is not a reward run with updates to "
                                         r"plot .* pass the --out of a reward run"):
        reward_module.main(["--out", str(saved_run), "--plot", str(tmp_path / "p.png")])
    with pytest.raises(SystemExit, match=r"error: no reward run in .*empty \(no ckpt.pt\) to "
                                         "plot"):
        reward_module.main(["--out", str(tmp_path / "empty"), "--plot", str(tmp_path / "p.png")])
    with pytest.raises(SystemExit, match=r"error: no reward run to resume in .*none \(no "
                                         r"ckpt.pt\): start one with --init-from"):
        reward_module.main(["--resume", "--out", str(tmp_path / "none")])
    out = tmp_path / "r"
    train_reward(reward_cfg(reward_start, sample_data_dir, out, max_steps=1))
    with pytest.raises(SystemExit, match=r"--resume cannot change what the run in .* fixed: "
                                         r"--kl-coef 0.5 \(the run has 0.1\)"):
        reward_module.main(["--resume", "--out", str(out), "--kl-coef", "0.5"])
    with pytest.raises(SystemExit, match=r"is not a reward run \(no 'reward' entry"):
        reward_module.main(["--resume", "--out", str(saved_run), "--data-dir",
                            str(sample_data_dir)])


def test_a_reward_run_holds_the_folder_lock_and_watches_for_a_busy_machine(
        reward_start, sample_data_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / LOCK_NAME).write_text(f"{os.getppid()}\n")  # a live process holds it
    with pytest.raises(FolderInUse, match="is in use by process"):
        train_reward(reward_cfg(reward_start, sample_data_dir, out))
    (out / LOCK_NAME).unlink()
    monkeypatch.setattr(reward_module.LoopShell, "__init__", busy_shell(LoopShell.__init__))
    records = train_reward(reward_cfg(reward_start, sample_data_dir, out))
    assert records[1]["busy"].startswith("busy: this run got") and "busy" not in records[0]
    assert "busy: this run got" in capsys.readouterr().err
    assert not (out / LOCK_NAME).exists()  # given back at the end


def busy_shell(real_init):
    """LoopShell.__init__, with a busy watch that reports a busy machine at the second step."""
    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        calls = []
        self.watch.step = lambda: calls.append(1) or (
            "busy: this run got 0.9 of the 2 cores" if len(calls) == 2 else None)
    return init


def test_a_budget_prices_evaluations_from_recent_ones_and_advises_from_a_measured_pace(capsys):
    from tiny_llm.budget import eval_time

    evals = [{"step": 0, "time_s": 0.0, "eval_s": 16.3}, {"step": 200, "time_s": 30.0,
             "eval_s": 1.4}, {"step": 400, "time_s": 60.0, "eval_s": 1.5}]
    assert eval_time(evals) == pytest.approx(1.45)  # step 0's busy first evaluation left out
    assert eval_time(evals[:1], bound=2.0) == 2.0  # alone, no slower than training batches
    cfg = TrainConfig(time_budget=1.0, max_steps=0, warmup_steps=100)
    records = [{"step": 0, "time_s": 0.0, "eval_s": 0.1}, {"step": 1, "time_s": 2.6}]
    Budget(cfg, [], 0).price(cfg, 1, records)  # the first update, one-off costs and all
    said = capsys.readouterr().out
    assert "only 1 update fit in 1 s, before the run's pace could be measured" in said
    assert "take about --time-budget" not in said  # no minutes priced from a one-off update


def test_the_shell_says_the_updates_made_against_the_budgets_first_plan():
    cfg = TrainConfig(time_budget=10.0, max_steps=0, warmup_steps=1, eval_interval=1000)
    shell = LoopShell(cfg, [], 0, 1, False)
    records = [{"step": 0, "time_s": 0.0, "eval_s": 0.0}]
    for step in range(1, 5):  # 1 s an update: about 10 fit
        records.append({"step": step, "time_s": float(step)})
        cfg = shell.after_update(cfg, step, records)
    assert shell.first_plan == 10 and shell.summary(4) == (
        "4 made in this run, against a first plan of 10")
    max_steps_alone = LoopShell(TrainConfig(time_budget=0, max_steps=5), [], 0, 1, False)
    assert max_steps_alone.summary(5) == ""  # --max-steps set the length: nothing to compare
