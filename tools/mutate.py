#!/usr/bin/env python3
"""A mutation check of remat's tests: applies plausible bugs, one at a time, to a copy of the
tree, builds, runs the tests that should notice, and reports which mutations survived.

    python3 tools/mutate.py            # the solver, simulator and report mutations (no LibTorch)
    python3 tools/mutate.py --torch    # runtime, profiler, models, weight readers, distributed
    python3 tools/mutate.py --list     # the mutations, with what each would break (--torch too)
    python3 tools/mutate.py --only ID  # one mutation
    python3 tools/mutate.py --check    # only that every mutation's text is found once
    python3 tools/mutate.py --all      # also those explained as equivalent (no test can kill
                                       # them: by default not run, a whole test run each)

The copy is made with `git archive HEAD` in build-mutate/tree (committed code only) and
built without LibTorch (REMAT_WITH_TORCH=OFF) in build-mutate/build: the solver, report and
CLI tests. With --torch, in build-mutate-torch/ against scripts/run.sh's PyTorch (with the
torchvision comparisons), each mutation checked by its component's test programs
(TORCH_TESTS); 37 minutes on 2 cores for 28 of them, so CI runs only the first kind. Exit status 1
when a mutation survives without a written reason (EXPLAINED); a surviving mutation needs a
test, or such a reason. docs/testing.md reports the kill rate.
"""
import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (id, file, the text replaced, its replacement, what the bug would be)
MUTATIONS = [
    ("sim-fwd-tmp", "solver/src/simulator.cpp",
     "temporary_ = stage->fwd_tmp_bytes;", "temporary_ = 0;",
     "the simulator forgets a forward's temporary memory"),
    ("sim-nograd-tmp", "solver/src/simulator.cpp",
     "temporary_ = stage->nograd_tmp_bytes();", "temporary_ = stage->fwd_tmp_bytes;",
     "a forward without autograd is charged the autograd forward's temporary"),
    ("sim-loss-tmp", "solver/src/simulator.cpp",
     "temporary_ = chain_.loss_tmp_bytes;", "temporary_ = 0;",
     "the loss's temporary is not counted"),
    ("sim-bwd-tmp", "solver/src/simulator.cpp",
     "temporary_ = stage->bwd_tmp_bytes;", "temporary_ = 0;",
     "a backward's temporary is not counted"),
    ("sim-loss-gradient", "solver/src/simulator.cpp",
     "const bool differentiated = member.grad && member.loss_gradient;",
     "const bool differentiated = member.grad;",
     "y_L holds a gradient for a member the loss does not differentiate (a model's logits "
     "beside its loss)"),
    ("sdp-loss-passed", "solver/src/storage_dp.cpp",
     "if (member.carried() && member.grad && member.loss_gradient)",
     "if (member.carried() && member.grad)",
     "the storage table takes a member of x_L the loss does not differentiate as passing its "
     "gradient on"),
    ("sim-saved-outputs", "solver/src/simulator.cpp",
     "held.push_back(value_[ui + 1][static_cast<std::size_t>(k)]);", "(void)k;",
     "the autograd state does not hold the output members the stage saves"),
    ("sim-keep-x0", "solver/src/simulator.cpp",
     "    if (k == 0) return;\n", "    if (k < 0) return;\n",
     "the caller's input x_0 is freed by the schedule"),
    ("sim-lifetime", "solver/src/simulator.cpp",
     "return next_read[uk] != kNever && next_read[uk] < next_produce[uk];",
     "return next_read[uk] != kNever && next_read[uk] <= next_produce[uk];",
     "a value is kept although it is produced again before its next read"),
    ("sim-grad-release", "solver/src/simulator.cpp",
     "        if (id >= 0) memory_.release(id, Memory::kGradient);\n", "        (void)id;\n",
     "B_i never frees y_{i+1}"),
    ("sim-output-dropped", "solver/src/simulator.cpp",
     "    if (chain_.output_held)\n", "        if (false)\n",
     "the caller's x_L is not counted after the loss"),
    ("dp-output-tail", "solver/src/unit_chain.h",
     "return l == length ? tail : 0;", "return 0;",
     "the dynamic program forgets the caller's x_L in the parts of a leaf after the loss"),
    ("dp-output-shared", "solver/src/unit_chain.h",
     "if (l == length) backward += tail - (i + 1 == length ? tail_shared : 0);",
     "if (l == length) backward += tail - tail_shared;",
     "every chain step after the loss subtracts what B_{L-1} shares of x_L"),
    ("dp-restart-loss", "solver/src/unit_chain.h",
     "return j < length ? restart : 0.0;", "return restart;",
     "the dynamic program charges a restart after the loss, where no backward came before"),
    ("sim-restart", "solver/src/simulator.cpp",
     "begin += chain.restart_ms;", "begin += 0;",
     "the simulator forgets the restart of a forward right after a backward"),
    ("units-round-down", "solver/include/remat/solver/solver.h",
     "return bytes / unit_bytes + (bytes % unit_bytes != 0 ? 1 : 0);", "return bytes / unit_bytes;",
     "sizes are rounded down to memory slots, so a schedule can exceed its budget"),
    ("parse-kib", "base/src/units.cpp",
     '{"KiB", std::int64_t{1} << 10},', '{"KiB", 1000},', "KiB parsed as 1000 bytes"),
    ("periodic-size", "solver/src/heuristics.cpp",
     "const int size = length / segments;", "const int size = (length + segments - 1) / segments;",
     "periodic's segments are sized as rounded up, not as checkpoint_sequential does"),
    ("dp-lf-bound", "solver/src/unit_chain.h",
     "const std::int64_t next = x[a - 1] + x[a] + nt[a - 1];",
     "const std::int64_t next = x[a - 1] + x[a];",
     "the dynamic program forgets a no-grad forward's temporary in a bound"),
    ("search-unchecked", "solver/src/strategies.cpp",
     "if (sequence.empty() || sim.peak_bytes > budget) {", "if (sequence.empty()) {",
     "the search above the budget keeps a sequence whose exact peak exceeds the budget"),
    ("search-none", "solver/src/strategies.cpp",
     "std::min(store_all_bytes, budget + 2 * carried);", "budget;",
     "the search above the budget never searches"),
    ("pin-never", "solver/src/merge.cpp",
     "if (!carried) return std::nullopt;", "if (carried || !carried) return std::nullopt;",
     "x_0's members carried on without gradient are not solved as context: the dynamic "
     "program counts them in every activation"),
    ("merge-fwd-tmp", "solver/src/merge.cpp",
     "fwd_peak = std::max(fwd_peak, states + held_bytes + unheld_values + stage.fwd_tmp_bytes);",
     "fwd_peak = std::max(fwd_peak, states + held_bytes + unheld_values);",
     "a merged stage's forward forgets its stages' temporaries"),
    ("merge-bwd-gradient", "solver/src/merge.cpp",
     "std::max(first, first_in[u] - 1);", "std::max(first, first_in[u]);",
     "a merged backward's temporary frees an inner gradient one backward early"),
    ("merge-expand-backward", "solver/src/merge.cpp",
     "for (int k = end - 1; k >= begin; --k) out.push_back(bwd(k));",
     "for (int k = begin; k < end; ++k) out.push_back(bwd(k));",
     "an expanded merged backward runs its stages in forward order"),
    ("merge-never", "solver/src/strategies.cpp",
     "return candidate_ms < current_ms * (1 - 1e-12);", "return candidate_ms < current_ms * 0;",
     "the merged chain's schedule is never chosen"),
    ("merge-least", "solver/src/strategies.cpp",
     "if (!least_) least_ = min_feasible_budget(merged_.chain, options_);",
     "if (!least_) least_ = std::numeric_limits<std::int64_t>::max();",
     "min_feasible_budget() ignores the merged chain's least budget, which solve() reaches"),
    ("storage-passed", "solver/src/storage_dp.cpp",
     "return grad[i + 1] + grad[i] - passed[i];", "return grad[i + 1] + grad[i] + 0 * passed[i];",
     "the storage-exact table counts a gradient passed on in place twice during the backward"),
    ("storage-tail", "solver/src/storage_dp.cpp",
     "Model::join(kept, c.x[static_cast<std::size_t>(length)])", "kept",
     "the storage-exact table forgets the caller's x_L during a backward after the loss"),
    ("storage-right-held", "solver/src/storage_dp.cpp",
     "part.right_z = state(j, Model::meet(xi, c.x[static_cast<std::size_t>(j)]));",
     "part.right_z = state(j, {});",
     "the storage-exact table counts again, in a leaf's right part, the storages x_i holds"),
    ("storage-never", "solver/src/strategies.cpp",
     "out.candidate = candidate_of(std::move(sequence), std::move(sim), storage.discretization,",
     "if (best == nullptr) out.candidate = candidate_of(std::move(sequence), std::move(sim), storage.discretization,",
     "the storage-exact table's sequence is never chosen over another that fits"),
    ("sim-grad-size", "solver/src/simulator.cpp",
     "if (ids[k] < 0) ids[k] = memory_.make(input[k].gradient_size());",
     "if (ids[k] < 0) ids[k] = memory_.make(input[k].bytes);",
     "the simulator counts a member's gradient at its storage's size, not grad_bytes"),
    ("storage-passed-size", "solver/src/storage_dp.cpp",
     "if (receives[k]) passed[i] += input[k].gradient_size();",
     "if (receives[k]) passed[i] += input[k].bytes;",
     "the storage-exact table takes a passed gradient for its member's storage size"),
    ("merge-grad-size", "solver/src/merge.cpp",
     "const std::int64_t size = storage[u].gradient_size();",
     "const std::int64_t size = storage[u].bytes;",
     "the merged stage counts its inner gradients at their members' storage sizes"),
    ("host-right-level", "solver/src/host_table.cpp",
     "const RowView& moved = row(j, l, false, k - levels_.size(i));",
     "const RowView& moved = row(j, l, false, k);",
     "under a host bound, an offloading leaf's right part may fill the host as if x_i's copy "
     "were not there"),
    ("host-least-level", "solver/src/host_table.cpp",
     "const std::int64_t moved = at(j, l, false, k - levels.size(i));",
     "const std::int64_t moved = at(j, l, false, k);",
     "under a host bound, the least memory lets an offloading leaf's right part fill the host "
     "as if x_i's copy were not there"),
    ("plot-off-scale", "report/src/plots.cpp",
     "const bool off_scale = p.makespan_ms > y.d1;", "const bool off_scale = false;",
     "points above the trade-off plot's scale are drawn outside it"),
    ("plot-peak-at-budget", "report/src/plots.cpp",
     "const double peak_y = y(static_cast<double>(sim.peak_bytes));",
     "const double peak_y = budget_y;",
     "the schedule plot's peak marker is drawn on the budget line, not at the peak"),
    ("plot-aggregate-end", "report/src/plots.cpp",
     "const double x0 = x(first.start_ms), x1 = x(last.end_ms);",
     "const double x0 = x(first.start_ms), x1 = x(first.end_ms);",
     "an aggregated mark of the schedule plot ends where its first operation does"),
    ("plot-bin-last", "report/src/plots.cpp",
     "fwd[b] = std::max(fwd[b], s.fwd_ms);", "fwd[b] = s.fwd_ms;",
     "a bin of the profile plot shows its last stage's forward time, not the largest"),
]


# The LibTorch components' mutations (--torch): built against a LibTorch with the torchvision
# comparisons, each checked by the test programs of TORCH_TESTS for its component.
TORCH_MUTATIONS = [
    # ---- runtime/ ---------------------------------------------------------------------------
    ("rt-rng-replay", "runtime/src/executor.cpp",
     "    set_generator_state(c10::Device(c10::kCPU), cpu_rng_[ui].tensor());\n",
     "",
     "a recomputation does not replay the CPU generator state of the stage's first forward: "
     "dropout draws a new mask"),
    # Killed by tests/runtime/checkpointable_test.cpp, TEST_CASE "checkpointed training equals
    # plain training, bit for bit" (conv_chain with Dropout; recompute-all and the optimal
    # schedule at the least budget recompute the dropout stage, whose graph then holds another
    # mask: input and parameter gradients differ from plain training's), also "under autocast,
    # recomputations run as the forward did: bfloat16 on the CPU"; tests/runtime/
    # tuple_stages_test.cpp "stages with tuples, context, TorchScript and callables train exactly
    # as plain autograd" (dropout in Down, the transformer, the scripted and callable stages);
    # tests/models/models_test.cpp "dropout inside stages (DenseNet's drop_rate) recomputes the
    # same masks". The caller's state is still saved and restored, so only the masks change.

    ("rt-bn-restore-after-backward", "runtime/src/executor.cpp",
     "    if (restore_after_backward_[static_cast<std::size_t>(k)]) restore_buffers(k);\n",
     "    (void)k;\n",
     "BatchNorm's running statistics are not restored after a recomputation with autograd "
     "(F_all): they are updated twice in a step"),
    # Survives, explained below (EXPLAINED). It was killed by tests/runtime/checkpointable_test.cpp
    # "checkpointed training equals plain training, bit for bit" before recomputations started
    # from the first forward's buffers: check_equal compares net.buffers() (running_mean, running_var,
    # num_batches_tracked) with plain training's after two steps; under recompute-all and the
    # optimal schedule at the least budget every BatchNorm stage's last forward is an F_all
    # recomputation just before its B_i, whose snapshot is then never restored (a later no-grad
    # recomputation cannot fix it: there is none after it). Also tuple_stages_test.cpp "stages
    # with tuples, context, TorchScript and callables train exactly as plain autograd" (state
    # includes chk->buffers(): U-Net BatchNorms, the scripted and callable batch_norm stats).
    # restore_after_backward_ stays a member that is written: no unused-variable warning.

    ("rt-bn-no-freeze", "core/src/stage.cpp",
     "      *norm.momentum = 0.0;\n", "",
     "a recomputation of a stage whose buffers are all BatchNorm statistics moves the running "
     "averages again (its batch is still not counted)"),
    # Killed by tests/runtime/checkpointable_test.cpp "a recomputation freezes its stage's
    # BatchNorms: no copies, statistics as plain training's" (check_equal: the running averages
    # differ from plain training's; the settings seen during recomputations are momentum 0.1,
    # not 0) and "checkpointed training equals plain training, bit for bit" (conv_chain's
    # BatchNorm stages).
    ("rt-bn-count-twice", "core/src/stage.cpp",
     "      *norm.batches = torch::Tensor();  // BatchNorm's forward counts the batch only if defined\n",
     "",
     "a recomputation of a BatchNorm stage counts its batch again (num_batches_tracked)"),
    # Killed by the same two tests: num_batches_tracked is a buffer check_equal compares.
    ("rt-bn-no-thaw", "runtime/src/executor.cpp",
     "  caller_cuda_rng_ = HostCopy();\n  thaw_norms();\n",
     "  caller_cuda_rng_ = HostCopy();\n",
     "the BatchNorms a recomputation froze stay frozen: the next recomputation of another stage "
     "finds them so, and the next step's forwards update nothing"),
    # Killed by the runtime's internal assert (a second recomputation while BatchNorms are frozen)
    # in the same tests, and by their check that the settings are as set after the steps.

    ("rt-no-fused-backward", "runtime/src/executor.cpp",
     "  const bool fuse = fuse_backward.load();\n", "  const bool fuse = false;\n",
     "every backward runs in an engine call of its own: one per stage, where plain autograd "
     "makes one for the whole backward"),
    # Killed by tests/runtime/tuple_stages_test.cpp "consecutive backwards run in one engine
    # call, as exact as a call per stage": the calls counted (two per store-all step of a chain
    # without carried gradients).
    ("rt-fuse-carried", "runtime/src/executor.cpp",
     "!chain.carries_gradient(op.stage + 1) && !chain.carries_gradient(op.stage))",
     "(chain.carries_gradient(op.stage) || true))",
     "backwards are fused across an activation whose carried member's gradient the runtime "
     "must sum itself"),
    # Killed by the same test on the U-Net (its skips are carried with gradients): the runtime's
    # internal assert, and the calls counted.

    ("rt-keep-dead-output", "runtime/src/executor.cpp",
     "  if (op.is_forward() && !lifetimes_.keep_output[index]) x_[input + 1].clear();\n",
     "",
     "the runtime keeps a forward's output that no later forward reads (after F_all i before "
     "B_i): activations accumulate during the backward phase"),
    # Killed by tests/runtime/per_layer_test.cpp "one layer per stage: store-all peaks as plain
    # autograd, schedules as predicted" (CHECK(measured == s.peak_bytes - kR + kLossScalars) at
    # the least and intermediate budgets: each recomputed stage's x_{i+1} is then held to the end
    # of the step; a convolution's output is not saved by its graph, so the bytes are extra),
    # tuple_stages_test.cpp "tuple stages: store-all peaks as plain autograd, schedules within
    # their budget" (measured == predicted, measured <= budget), checkpointable_test.cpp
    # "measured peak stays within the budget and close to the prediction" and "with the loss
    # measured, a cross-entropy step stays within every budget" (measured <= budget at the least
    # budget). Store-all is unaffected (every F_all's output is read by the next forward), so
    # only schedules with recomputation catch it; they are in all of these tests.

    # ---- profiler/ --------------------------------------------------------------------------
    ("prof-peak-before-add", "profiler/src/cpu_memory_tracker.cpp",
     "const std::int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;",
     "const std::int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed);",
     "the CPU tracker compares the live bytes before an allocation (fetch_add's old value) with "
     "its peak and the limit: peaks miss the latest allocation, the limit lets one through"),
    # Killed by tests/profiler/memory_tracker_test.cpp "PeakScope measures the growth of one
    # operation" (allocates 2000 then 400 bytes: the peak records 2000, not 2400) and "a CPU
    # allocation beyond the limit, or one that fails, is an out-of-memory error" (the 1 MiB
    # allocation over a limit of +1 MiB with 512 KiB live is compared as 512 KiB: no error,
    # FAIL("no error beyond the limit")). Also the runtime's peak-vs-prediction tests
    # (per_layer_test.cpp, tuple_stages_test.cpp) whose measured peaks drop below the prediction.

    ("prof-saved-output-twice", "profiler/src/profiler.cpp",
     "        state_bytes -= stage_.outputs[o].bytes;\n",
     "",
     "an output member that the stage's graph saves is counted in state_bytes as well as in the "
     "output's bytes (twice)"),
    # Killed by tests/profiler/profiler_test.cpp "profiling a conv chain gives a valid chain with
    # exact activation sizes" (Conv+BN+ReLU saves its output: CHECK(block.state_bytes ==
    # block.out_bytes() + 2 * 8 * 4) gets 2 * out_bytes + 64) and "the measured store-all peak
    # equals the simulator's prediction" (the prediction grows by every ReLU output: measured <
    # predicted - kLossScalar); also per_layer_test.cpp's CHECK(full == plain - kLossScalars).
    # The loop keeps its push_back: nothing becomes unused.

    ("prof-kept-gradient-bytes", "profiler/src/profiler.cpp",
     "  count_kept_gradients(produced, device, result.chain);\n",
     "  (void)&count_kept_gradients;\n",
     "a gradient the runtime keeps as a slice's copy with its gaps is counted with the member's "
     "elements only: below what it takes"),
    # Killed by tests/runtime/tuple_stages_test.cpp "tuple stages: store-all peaks as plain
    # autograd, schedules within their budget" (a BatchNorm right before a concatenation: the
    # step 64 bytes above its prediction at the least budget).

    ("prof-loss-output-kept", "profiler/src/profiler.cpp",
     "        if (!options.output_held()) values.clear();\n",
     "",
     "the loss of a step that lets the output go (output_held false) is measured with x_L still "
     "held: loss_tmp_bytes counts the logits the step frees"),
    # Killed by tests/runtime/checkpointable_test.cpp "a loss measured with the output let go
    # gives the budget the logits back, exactly" (3000-class head at batch 64: the let-go step's
    # measured peak is 768,000 bytes, one logits, below the prediction at every budget, and the
    # two store-all peaks no longer differ by the logits). The profiler's own store-all test
    # passes: its chains' store-all peaks fall where the loss's memory does not show.

    ("prof-output-held-flag", "profiler/src/profiler.cpp",
     "  result.chain.output_held = options.output_held();\n",
     "  result.chain.output_held = true;\n",
     "the chain forgets that its step lets the output go: every prediction after the loss "
     "counts x_L the step does not keep"),
    # Killed by tests/profiler/profiler_test.cpp "the measured store-all peak equals the
    # simulator's prediction" (the let-go column: predicted above measured by x_L), and
    # checkpointable_test.cpp "a loss measured with the output let go ..." (the chain's flag,
    # and its JSON, say held; every let-go budget's prediction is one logits too high).

    # Tuple stages counted by storage (sessions 30-41): each killed on 2026-11-29, by hand
    # against the development build and by this script (--only), by the test named below each.
    ("prof-member-own-elements", "profiler/src/profiler.cpp",
     "  Member member{std::max(storage_bytes({t}), kept_alive), grad};\n",
     "  Member member{std::max(counted_bytes(t.device(), static_cast<std::int64_t>(t.numel()) * "
     "t.element_size()), kept_alive), grad};\n",
     "a member is counted with its own elements, not its storage: a slice carried on past its "
     "base keeps the whole storage alive, above the prediction and the budget"),
    # profiler_test.cpp "a slice of another output member counts its whole storage, which it
    # keeps alive".
    ("prof-view-kept-alive", "profiler/src/profiler.cpp",
     "        kept_alive = std::max(kept_alive, in_members_[k].bytes);\n",
     "        kept_alive = std::max(kept_alive, std::int64_t{0});\n",
     "a view of an input member that is itself a view of a larger storage (q of a projection "
     "that makes q, k and v at once) is counted with the storage of the copy it was profiled "
     "on, not the larger one it keeps alive in the chain: steps above their prediction"),
    # profiler_test.cpp "a view of an input member counts what that member keeps alive, where it
    # is more".

    ("prof-grad-as-storage", "profiler/src/profiler.cpp",
     "    if (gradient != member.bytes) member.grad_bytes = gradient;\n",
     "    (void)gradient;\n",
     "a member's gradient is counted at its storage's size: an expanded member's gradient is "
     "larger, and the step goes above its prediction"),
    # profiler_test.cpp "a member's gradient is counted with the member's elements, not its
    # storage's".

    ("prof-storage-per-tensor", "profiler/src/profiler.cpp",
     "    if (seen.insert(t.storage().unsafeGetStorageImpl()).second)\n",
     "    if (seen.insert(t.storage().unsafeGetStorageImpl()).second || true)\n",
     "tensors that share a storage are counted once each: a mask and its transpose given as "
     "context count twice"),
    # profiler_test.cpp "context is counted by storage: two views of one mask once, a row with
    # its whole table" (new with this mutation: no test gave two context tensors one storage).

    ("prof-carried-as-new", "profiler/src/profiler.cpp",
     "    if (out.is_same(inputs[k])) return static_cast<int>(k);\n",
     "    if (out.is_same(inputs[k]) && false) return static_cast<int>(k);\n",
     "a member returned as it came is taken for a new tensor: a skip carried past a stage is "
     "counted again as its output, and a member returned twice is no longer refused"),
    # profiler_test.cpp "a slice of another output member counts its whole storage, which it
    # keeps alive" (its carried_from), and the tuple stages' tests.

    ("rt-larger-input-accepted", "runtime/src/checkpointable.cpp",
     "          fits = t.size(static_cast<std::int64_t>(d)) <= sig.sizes[d];\n",
     "          fits = t.size(static_cast<std::int64_t>(d)) > 0;\n",
     "an input larger than the one measured is accepted: its activations are larger than the "
     "schedule's, and the step goes over the budget"),
    # checkpointable_test.cpp's test of inputs other than the one measured ("the input is
    # 5x3x12x12 but the schedule was computed for ...").

    # ---- models/ ----------------------------------------------------------------------------
    ("models-resnet-bn-swap", "models/src/resnet.cpp",
     '      conv1_ = register_module("conv1", conv2d(inplanes, planes, 3, stride, 1));\n'
     '      bn1_ = register_module("bn1", nn::BatchNorm2d(planes));\n'
     '      conv2_ = register_module("conv2", conv2d(planes, planes, 3, 1, 1));\n'
     '      bn2_ = register_module("bn2", nn::BatchNorm2d(planes));\n',
     '      conv1_ = register_module("conv1", conv2d(inplanes, planes, 3, stride, 1));\n'
     '      bn1_ = register_module("bn2", nn::BatchNorm2d(planes));\n'
     '      conv2_ = register_module("conv2", conv2d(planes, planes, 3, 1, 1));\n'
     '      bn2_ = register_module("bn1", nn::BatchNorm2d(planes));\n',
     "the BasicBlock (resnet18/34) registers its two BatchNorms under each other's names: "
     "torchvision's bn1 weights load into the BatchNorm after conv2 and bn2's after conv1"),
    # Killed by tests/models/torchvision_test.cpp "the 19 ports reproduce torchvision's
    # eval-mode outputs, with every weight randomized" (sections resnet18 and resnet34: every
    # BatchNorm tensor is randomized, and damp_residuals scales bn2's weight to 0.1-0.3 against
    # bn1's 0.5-1.5, so the outputs differ by far more than kTolerance) and "resnet18 trains
    # like torchvision's: output, input gradient, statistics". Also, without torchvision, by
    # tests/models/models_test.cpp "options: zero_init_residual, DenseNet's free configuration":
    # resnet18(zero_init_residual) zeroes last_bn() == bn2_, now named "bn1", so
    # named_parameters()["layer2_1.bn2.weight"] is all ones, not zero. The set of names and
    # shapes is unchanged ("the ports have torchvision's names and shapes at full size" passes).

    ("models-densenet-cat-order", "models/src/densenet.cpp",
     "    return torch::cat({x, features}, 1);\n",
     "    return torch::cat({features, x}, 1);\n",
     "a dense layer appends its new features before its input's instead of after them "
     "(torchvision concatenates [previous features..., new]): every later layer's weights "
     "meet the channels in the wrong order"),
    # Killed by tests/models/torchvision_test.cpp "the 19 ports reproduce torchvision's
    # eval-mode outputs, with every weight randomized" (sections densenet121, densenet161,
    # densenet169, densenet201: shapes are unchanged, so the weights load, but norm1/conv1 of
    # every following layer, the transitions and norm5 see permuted channels). Not killed
    # without torchvision: models_test.cpp checks only shapes and checkpointed-vs-plain
    # DenseNets, which run the same (mutated) code on both sides.

    # ---- more runtime/ and models/ ---------------------------------------------------------

    ("rt-carried-grad-overwrite", "runtime/src/executor.cpp",
     "    root_grads.push_back(std::move(carried[k]));\n",
     "    root_grads.push_back(torch::zeros_like(carried[k]));\n",
     "the gradient a stage computes for an input member it also carries on replaces the gradient "
     "passed back for that member instead of being added to it"),
    # Killed by tests/runtime/tuple_stages_test.cpp "stages with tuples, context, TorchScript and
    # callables train exactly as plain autograd", section "U-Net with carried skips" (Down's input
    # is both pooled inside the stage and carried as a skip to Up: the stem's parameter gradients
    # and the input gradient lose one of the two contributions), at every budget, store-all
    # included: the passed gradient enters the stage's backward as zeros.

    ("models-inception-bn-eps", "models/src/inception.cpp",
     'bn(register_module("bn", nn::BatchNorm2d(nn::BatchNormOptions(out).eps(0.001)))) {}',
     'bn(register_module("bn", nn::BatchNorm2d(nn::BatchNormOptions(out)))) {}',
     "Inception's BasicConv2d uses BatchNorm's default eps (1e-5) instead of torchvision's 0.001"),
    # Killed by tests/models/torchvision_test.cpp "the 19 ports reproduce torchvision's eval-mode
    # outputs, with every weight randomized" (sections inception_v3, inception_v3_noaux,
    # inception_v3_transform: running_var is randomized in 0.5-1.5, so each of ~94 BatchNorms
    # scales by about 1 + 5e-4, far above kTolerance 1e-5) and "Inception v3's two heads in
    # training mode match torchvision's InceptionOutputs".

    # ---- the readers of weight files (models/src/state_dict.cpp, safetensors.cpp) -------------
    # Each killed by tests/models/hostile_files_test.cpp or safetensors_test.cpp, which require
    # the reader's own message for each hostile file.
    ("sd-stack-cap", "models/src/state_dict.cpp",
     "    if (stack_.size() >= kMaxStack) {\n", "    if (false) {\n",
     "a pickle's stack grows without bound (a million DUPs from a 1 MB file)"),
    # hostile_files_test.cpp "read_state_dict caps the values, the stack and the memo a pickle
    # builds", section "a stack of a million values".

    ("sd-memo-cap", "models/src/state_dict.cpp",
     "    if (memo_.size() >= kMaxMemo && memo_.count(key) == 0) {\n", "    if (false) {\n",
     "a pickle's memo grows without bound"),
    # The same test, section "a million memo entries".

    ("sd-mark-cap", "models/src/state_dict.cpp",
     "          if (marks_.size() >= kMaxStack) {\n", "          if (false) {\n",
     "a pickle's MARKs grow without bound"),
    # The same test, section "a million MARKs".

    ("sd-deflate-ratio", "models/src/state_dict.cpp",
     "                    : entry.compressed > file_size ||\n"
     "                          entry.size > kMaxDeflateRatio * entry.compressed + 1024) {\n",
     "                    : entry.compressed > file_size) {\n",
     "a deflated zip record may declare any size: 2 GiB allocated for a few bytes"),
    # hostile_files_test.cpp "read_state_dict checks the sizes a zip archive declares before it
    # allocates" (a deflated record that declares 2 GiB).

    ("st-overlap", "models/src/safetensors.cpp",
     "    if (tensor.begin < covered) {\n", "    if (false) {\n",
     "safetensors tensors whose bytes overlap are accepted"),
    # safetensors_test.cpp "read_safetensors names the file and the problem" ("overlap", "an
    # empty tensor inside another").

    ("st-bool-byte", "models/src/safetensors.cpp",
     "        if (values[i] > 1) {\n", "        if (values[i] > 2) {\n",
     "a BOOL byte of 2 is accepted"),
    # The same test ("a BOOL that is 2").

    ("st-header-beyond", "models/src/safetensors.cpp",
     "  if (header_bytes > file.size() - 8) {\n", "  if (header_bytes > file.size()) {\n",
     "a header length that runs up to 8 bytes past the file is not refused as such"),
    # The same test ("header length one byte beyond the file": the read then fails with another
    # message).

    # ---- distributed/ -----------------------------------------------------------------------
    # Each killed by tests/distributed/distributed_test.cpp, whose workers (dp_worker.cpp) train
    # dp_network: a BatchNorm, a weight tied to two stages, buckets of 4 KiB.
    ("dist-no-mean", "distributed/src/data_parallel.cpp",
     "  for (auto& bucket : buckets_) bucket->flat.div_(size);\n", "",
     "the gradients are summed over the ranks, not averaged"),
    # "data-parallel training on Gloo equals one process averaging the ranks' gradients".

    ("dist-no-start-copy", "distributed/src/data_parallel.cpp",
     '  broadcast_from_rank0(state, "the parameters and buffers");\n', "",
     "each rank starts from its own weights, not rank 0's"),
    # Same test: every rank's .initial.pt must be rank 0's dp_network(1234).

    ("dist-start-copy-params-only", "distributed/src/data_parallel.cpp",
     "  for (const auto& b : module_->buffers(true)) state.push_back(b);\n", "",
     "the buffers (BatchNorm's running statistics) are not copied from rank 0 at the start"),
    # Same test: .initial.pt holds the buffers too, which dp_network randomizes per seed. (The
    # trained buffers alone would not show it: the copy after each backward replaces them.)

    ("dist-no-buffer-copy", "distributed/src/data_parallel.cpp",
     '  if (options_.broadcast_buffers()) broadcast_from_rank0(module_->buffers(true), "the buffers");\n',
     "", "the buffers are not copied from rank 0 after each backward: each rank's statistics "
         "follow its own batches"),
    # Same test: the reference's buffers are those rank 0's batches give.

    ("dist-tied-first-gradient", "distributed/src/data_parallel.cpp",
     "  if (received < expected_[k]) return;\n", "",
     "a weight tied to two stages is ready at its first gradient: its bucket's all-reduce starts "
     "before the second is accumulated"),
    # "DataParallel launches a bucket's all-reduce once all its gradients are complete": one
    # rank on a stand-in process group that records each bucket when its all-reduce is launched;
    # the last bucket (dp_network's first Linear, whose weight the TiedTranspose stage reuses)
    # is launched before stage 0's gradients are all in. Over Gloo the race is nearly always
    # won by the backward, and the Gloo test passes.

    ("dist-launch-after-backward", "distributed/src/data_parallel.cpp",
     "  if (--bucket.pending == 0) launch_ready();\n", "  --bucket.pending;\n",
     "every all-reduce starts after the backward: no overlap (the results are right)"),
    # Same test: each rank's .overlap must show every bucket launched during the backward.

    ("dist-describe-no-shape", "distributed/src/data_parallel.cpp",
     "<< ' ' << sizes_string(p.value().sizes())\n", "\n",
     "ranks whose parameters differ in shape are not refused at start-up"),
    # "ranks with different models are refused at start-up" (a hidden width of 33 on rank 1):
    # the message must name line 1, the first Linear's weight; the mutated description first
    # differs at a BatchNorm buffer.

    ("dist-dtor-waits-after-failure", "distributed/src/data_parallel.cpp",
     "  if (group_->failed()) return;\n", "",
     "after a failure, DataParallel's destructor waits for the all-reduces left waiting on the "
     "lost rank"),
    # "a hung rank makes the others stop within the timeout, naming it": rank 0 must catch the
    # error within the timeout plus 4 s of rank 1's hang. Killed on LibTorch 1.13 only (EXPLAINED).

    ("dist-group-keeps-backend", "distributed/src/group.cpp",
     "  if (failed_) (void)collectives_.owner.release();\n", "",
     "after a failure, the group destroys its backend, which waits for each queued collective "
     "to time out"),
    # Same test: rank 0's group must be gone within 2 s of the error. Killed on 1.13 only.

    ("dist-leave-waits-for-hung", "distributed/src/group.cpp",
     "          continue;  // named by failure(): dead or hung, not to be waited for\n",
     "          {}\n",
     "rank 0's leave() waits for a rank it named as hung (whose heartbeat still beats)"),
    # Same test, same bound.

    ("dist-stray-backward-averaged-never", "distributed/src/data_parallel.cpp",
     "    if (no_sync_.load() > 0 || remat::detail::profiling()) return;\n", "    return;\n",
     "a plain loss.backward() beside DataParallel is accepted: its gradients are never averaged "
     "and the ranks drift apart"),
    # "what would make the ranks train different models without a word is refused": the plain
    # backward must exit 2 with the message.

    ("dist-profiling-is-a-stray-backward", "distributed/src/data_parallel.cpp",
     "    if (no_sync_.load() > 0 || remat::detail::profiling()) return;\n",
     "    if (no_sync_.load() > 0) return;\n",
     "the profiler's backwards on rank 0 are refused as a user's: a chain cannot be measured "
     "after DataParallel is made"),
    # "gradients cleared by zero_grad, to None or by an optimizer, are still averaged" with
    # --dp-first yes: rank 0 measures the chain with DataParallel's hooks on its parameters.

    ("dist-silent-rank-waited-for", "distributed/src/group.cpp",
     "(last_beat > 0 && silent_for > silence_limit)", "false",
     "a rank killed while the others wait in the store is named only after the whole timeout"),
    # "a rank killed or gone outside a collective is named long before the timeout": 60 s.

    ("rt-stage-error-unnamed", "runtime/src/executor.cpp",
     "    error.add_context(failed_in(i));\n", "",
     "a stage's own error at train time does not say which stage, or that it was a "
     "recomputation"),
    # "an error inside a stage names the stage, and whether it was a recomputation".
    ("rt-gradient-contiguous-copy", "core/src/stage_input.cpp",
     "    if (!layout) return gradient.clone();\n",
     "    return gradient.clone();\n",
     "a gradient given as a slice with gaps is kept as a contiguous copy: BatchNorm's CPU "
     "backward then sums in another order than plain autograd's"),
    # Killed by tests/runtime/tuple_stages_test.cpp "stages with tuples, context, TorchScript and
    # callables train exactly as plain autograd" (a BatchNorm right before a concatenation: the
    # input and parameter gradients differ) and "a kept gradient sliced with gaps keeps them,
    # narrowed".
]

# The test program, and its Catch arguments, that checks each component's mutations.
TORCH_TESTS = {
    "rt": ["remat_runtime_tests"],
    "prof": ["remat_profiler_tests", "remat_runtime_tests"],
    "models": ["remat_models_tests"],
    "sd": ["remat_models_tests"],
    "st": ["remat_models_tests"],
    "dist": ["remat_distributed_tests"],
}
# Programs the test programs run (built with them).
HELPERS = ["remat_dp_worker"]

# The test that noticed each mutation (the first to fail, from work/killed_by.txt of a whole
# run): run first, so that a mutation is usually judged in that test's time, not the suite's
# (without it the 35 mutations took 7.7 min in a fresh clone's test run, most of it in
# whole-suite runs). Only an order: a mutation this test does not notice still meets every
# other test. A name no test has any more stops the run (rename it here).
KILLED_BY = {
    'host-right-level': 'solver:host bound: the table is the fastest offloading nested schedule within both bounds',
    'host-least-level': 'solver:host bound: the table is the fastest offloading nested schedule within both bounds',
    'sim-fwd-tmp': 'solver:every algorithm returns a valid sequence within the budget',
    'sim-nograd-tmp': 'solver:merge: a residual block cut by layer becomes one stage, its fields derived by hand',
    'sim-loss-tmp': 'solver:every algorithm returns a valid sequence within the budget',
    'sim-bwd-tmp': 'solver:every algorithm returns a valid sequence within the budget',
    'sim-saved-outputs': 'solver:every algorithm returns a valid sequence within the budget',
    'sim-keep-x0': "solver:merge: solve() is as fast as the merged chain's solve, fits, and is never faster than the best nested schedule",
    'sim-grad-release': 'solver:every algorithm returns a valid sequence within the budget',
    'sim-output-dropped': 'solver:every algorithm returns a valid sequence within the budget',
    'dp-output-tail': 'solver:every algorithm returns a valid sequence within the budget',
    'dp-output-shared': 'solver:every algorithm returns a valid sequence within the budget',
    'dp-restart-loss': 'solver:persistent DP equals the top-down recurrence at every memory',
    'sim-restart': 'solver:persistent DP equals the top-down recurrence at every memory',
    'units-round-down': "solver:given slots: int64's largest budget does not overflow the units, and too few slots are infeasible at every budget",
    'parse-kib': 'base:sizes are parsed with units',
    'periodic-size': 'solver:optimal never needs more memory than a heuristic, with automatic units',
    'dp-lf-bound': 'solver:the DP is the best nested schedule when no-grad forwards need more than autograd ones',
    'search-unchecked': "solver:merge: solve() is as fast as the merged chain's solve, fits, and is never faster than the best nested schedule",
    'search-none': 'solver:with carried members solve() searches above the budget: it fits, is no slower than the DP at the budget, and never faster than the best nested schedule',
    'pin-never': 'solver:pin: a mask of x_0 carried on becomes context, every sequence the same',
    'merge-fwd-tmp': "solver:merge: solve() is as fast as the merged chain's solve, fits, and is never faster than the best nested schedule",
    'merge-bwd-gradient': "solver:merge: solve() is as fast as the merged chain's solve, fits, and is never faster than the best nested schedule",
    'merge-expand-backward': "solver:merge: solve() is as fast as the merged chain's solve, fits, and is never faster than the best nested schedule",
    'merge-never': "solver:merge: solve() is as fast as the merged chain's solve, fits, and is never faster than the best nested schedule",
    'merge-least': "solver:merge: solve() is as fast as the merged chain's solve, fits, and is never faster than the best nested schedule",
    'storage-passed': 'solver:with carried members the DP never overruns and is never faster than possible',
    'storage-tail': 'solver:with carried members the DP never overruns and is never faster than possible',
    'storage-right-held': 'solver:with carried members the DP never overruns and is never faster than possible',
    'storage-never': "solver:merge: tradeoff's optimal points are solve()'s, merged runs included",
    'sim-grad-size': 'solver:with carried members the DP never overruns and is never faster than possible',
    'storage-passed-size': 'solver:with carried members the DP never overruns and is never faster than possible',
    'merge-grad-size': 'solver:with carried members the DP never overruns and is never faster than possible',
    'plot-off-scale': 'report:tradeoff plot: a point far above the scale is drawn at its top edge, marked',
    'plot-peak-at-budget': 'report:schedule plot geometry: marks, budget line and peak where the axes put them',
    'plot-aggregate-end': 'report:schedule plot geometry: marks, budget line and peak where the axes put them',
    'plot-bin-last': "report:profile plot geometry: bar heights are the stages' values on their axes",
}

# Survivors with a written reason: they do not fail the check, and the reason is printed.
EXPLAINED = {
    "dist-dtor-waits-after-failure":
        "equivalent on LibTorch 2.9 and later, which this check builds against: Gloo's "
        "collectives time out with the group's timeout (setTimeout), and the ones queued behind "
        "the first then fail at once. Before 2.9 they wait Gloo's start-up timeout: on Debian's "
        "1.13 the hung-rank test kills it (rank 0 caught the error 41 s after the hang, not 6 s; "
        "checked by hand, 2026-11-24)",
    "dist-group-keeps-backend":
        "equivalent on LibTorch 2.9 and later, as dist-dtor-waits-after-failure; on 1.13 the "
        "hung-rank test kills it (rank 0's group took 114 s to go, not 10 ms; by hand)",
    "rt-bn-restore-after-backward":
        "equivalent for buffer updates that are a function of the buffers, the input and the "
        "random state: a recomputation starts from the buffers the stage's first forward read "
        "(entry_buffers_) and makes the same update, so what B_i would put back is what it "
        "leaves. The restore stays for updates that are not (a kernel whose atomics add in "
        "another order)",
    "sim-lifetime": "equivalent: the operation that next reads x_k (it reads x_k, produces "
                    "x_{k+1}) is never the one that next produces x_k, so < and <= agree",
}


def locate(base, path, old):
    """Where the mutation's text `old` is: (file relative to `base`, start, end) of its one
    occurrence. Whitespace between its tokens matches any whitespace, so that re-indenting or
    re-wrapping its line does not stop the run; where the text is not in `path` (the code
    moved), the one file of path's top folder that holds it once. Exits naming the mutation's
    file otherwise."""
    regex = re.compile(r"\s+".join(re.escape(token) for token in old.split()))

    def spans(rel):
        with open(os.path.join(base, rel)) as source:
            return [(m.start(), m.end()) for m in regex.finditer(source.read())]

    named = spans(path) if os.path.isfile(os.path.join(base, path)) else []
    if len(named) == 1:
        return (path,) + named[0]
    found = []
    if not named:
        for folder, _, files in os.walk(os.path.join(base, path.split("/")[0])):
            for name in sorted(files):
                if name.endswith((".cpp", ".h", ".cu")):
                    rel = os.path.relpath(os.path.join(folder, name), base)
                    found += [(rel,) + span for span in spans(rel)]
    if len(found) == 1:
        return found[0]
    return None


def nearest(base, path, old):
    """Where `old` most probably went when `locate` finds it nowhere (its line was edited): the
    window of as many lines of `path` as `old` has that reads most like it, as (line number,
    text), or None when nothing there is at least 60% alike. A refactor then costs one edit of
    the mutation, which the message shows."""
    file = os.path.join(base, path)
    if not os.path.isfile(file):
        return None
    with open(file) as source:
        lines = source.read().split("\n")
    want = " ".join(old.split())
    span = max(1, old.strip().count("\n") + 1)
    best, best_ratio = None, 0.6
    for i in range(len(lines)):
        window = " ".join(" ".join(lines[i:i + span]).split())
        if not window:
            continue
        ratio = difflib.SequenceMatcher(None, want, window).ratio()
        if ratio > best_ratio:
            best, best_ratio = (i + 1, window), ratio
    return best


def stale_mutations(base, catalogue):
    """The mutations of `catalogue` whose text `locate` does not find once in `base`, each as a
    message that names it and says where its text most probably went; and notes for those
    found in another file than their own."""
    stale, moved = [], []
    for mid, path, old, _, _ in catalogue:
        where = locate(base, path, old)
        if where is None:
            near = nearest(base, path, old)
            hint = f"; nearest, line {near[0]}: {near[1]}" if near else ""
            stale.append(f"mutation {mid}: its text is not found once in {path} (update it){hint}")
        elif where[0] != path:
            moved.append(f"mutation {mid}: its text is in {where[0]} now, not {path} (update its path)")
    return stale, moved


def mutate(text, start, end, old, new):
    """`text` with the span of `old` (from locate) replaced by `new`, less the whitespace that
    `old` has around its tokens and `new` repeats (the span excludes it)."""
    lead, trail = old[:len(old) - len(old.lstrip())], old[len(old.rstrip()):]
    if lead and new.startswith(lead):
        new = new[len(lead):]
    if trail and new.endswith(trail):
        new = new[:len(new) - len(trail)]
    return text[:start] + new + text[end:]


def run(cmd, cwd, log):
    with open(log, "a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        return subprocess.call(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)


def ctest_literal(name):
    """A ctest -R/-E expression that matches `name` as written (CMake's regular expressions)."""
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}" else c for c in name)


def torch_prefix(python):
    """LibTorch's CMake prefix of `python`'s torch (scripts/run.sh's virtual environment)."""
    return subprocess.run([python, "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
                          check=True, stdout=subprocess.PIPE, text=True).stdout.strip()


def default_python():
    pins = os.path.join(ROOT, "scripts", "torch-requirements.txt")
    digest = subprocess.run(["sha256sum", pins], check=True, stdout=subprocess.PIPE,
                            text=True).stdout[:12]
    cache = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return os.environ.get("REMAT_VENV", os.path.join(cache, "remat", "venv-" + digest)) + \
        "/bin/python"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--check", action="store_true",
                        help="only check that every mutation's text is found once, and exit")
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--torch", action="store_true",
                        help="the LibTorch components' mutations (runtime, profiler, models, distributed)")
    parser.add_argument("--python", default=None,
                        help="--torch: the Python whose torch and torchvision to build against "
                             "(default: scripts/run.sh's virtual environment)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--all", action="store_true",
                        help="also the mutations explained as equivalent everywhere, which no "
                             "test can kill (skipped otherwise: a whole test run each)")
    args = parser.parse_args()
    catalogue = TORCH_MUTATIONS if args.torch else MUTATIONS
    mutations = [m for m in catalogue if not args.only or m[0] in args.only]
    if args.list:
        for mid, path, _, _, why in mutations:
            print(f"{mid:28} {path:36} {why}")
        return 0
    if args.only and len(mutations) != len(args.only):
        sys.exit("remat: unknown mutation in --only (see --list, with --torch for LibTorch's)")
    # Both catalogues' texts first, in this tree: CI runs only the first, and a line edited since
    # would otherwise stop the --torch check only when someone runs it.
    # Every stale one at once: a refactor may have moved several.
    stale, moved = stale_mutations(ROOT, MUTATIONS + TORCH_MUTATIONS)
    for note in moved:
        print(f"remat: {note}", flush=True)
    if stale:
        sys.exit("\n".join(f"remat: {message}" for message in stale))
    if args.check:
        print(f"{len(MUTATIONS) + len(TORCH_MUTATIONS)} mutations, each text found once")
        return 0
    for mid in KILLED_BY:
        if mid not in {m[0] for m in MUTATIONS}:
            sys.exit(f"remat: KILLED_BY names {mid!r}, which is not a mutation (update it)")
    work = os.path.join(ROOT, "build-mutate-torch" if args.torch else "build-mutate")
    tree, build, log = (os.path.join(work, d) for d in ("tree", "build", "mutate.log"))
    # A fresh build too: `git archive` gives the sources the commit's times, older than objects
    # a previous run built from a mutated source, which make would then keep.
    shutil.rmtree(tree, ignore_errors=True)
    shutil.rmtree(build, ignore_errors=True)
    os.makedirs(tree)
    open(log, "w").close()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True,
                             stdout=subprocess.PIPE).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    all_programs = sorted({p for ps in TORCH_TESTS.values() for p in ps})
    # -O1: a mutated solver file compiles sooner than at -O3 (the 33 mutations in 6 min 21 s,
    # against 7 min 14 s), and these tests still run in 23 s.
    configure = ["cmake", "-S", tree, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 "-DREMAT_BUILD_BENCH=OFF", "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG"]
    if shutil.which("ccache") and os.environ.get("REMAT_CCACHE", "1") != "0":
        # Putting back a mutated header rebuilds every file that includes it, each as the
        # unmutated build compiled it: from ccache, seconds instead of a minute. The test
        # command's cache (scripts/ccache.sh, in its environment) also keeps each mutated file's
        # objects, so that a later run of the same commit compiles nothing; run alone, the
        # cache is work/ccache. The base folder is the clone, which holds work/.
        os.environ.setdefault("CCACHE_DIR", os.path.join(work, "ccache"))
        os.environ.setdefault("CCACHE_BASEDIR", ROOT)
        os.environ.setdefault("CCACHE_NOHASHDIR", "1")
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    if args.torch:
        python = args.python or default_python()
        if not os.path.exists(python):
            sys.exit(f"remat: no Python at {python}: run scripts/run.sh first, or give --python")
        configure += [f"-DCMAKE_PREFIX_PATH={torch_prefix(python)}", f"-DREMAT_PYTHON={python}",
                      "-DREMAT_SKIP_TRANSFORMERS_TESTS=ON"]
        targets = ["--target"] + all_programs + HELPERS
    else:
        configure += ["-DREMAT_WITH_TORCH=OFF"]
        targets = []
    build_cmd = ["cmake", "--build", build, "-j", str(args.jobs)] + targets

    # The tests that have failed on a mutation so far in this run, run first on each next one:
    # most mutations are noticed by a few of them, in seconds, where the whole suite, slowest
    # first, takes 20 s. The verdict is the same: the others run when these pass.
    killers = []
    # The test that noticed each mutation in this run (the first to fail), written at the end
    # to work/killed_by.txt, for KILLED_BY.
    noticed = {}

    def failed_tests():
        failed = os.path.join(build, "Testing", "Temporary", "LastTestsFailed.log")
        if not os.path.exists(failed):
            return []
        with open(failed) as lines:  # "<number>:<name>" per line
            return [n for n in (line.rstrip("\n").split(":", 1)[-1] for line in lines) if n]

    def ctest_pass(mid):
        cmd = ["ctest", "--test-dir", build, "-j", str(args.jobs)]
        if not mid:
            return run(cmd, ROOT, log) == 0
        cmd.append("--stop-on-failure")
        # First the test that noticed this mutation before, with those that noticed others in
        # this run; the rest only where these pass. The verdict is the whole suite's.
        first = ([KILLED_BY[mid]] if mid in KILLED_BY else []) + \
            [name for name in killers if name != KILLED_BY.get(mid)]
        if first:
            pattern = "^(" + "|".join(ctest_literal(name) for name in first) + ")$"
            if run(cmd + ["-R", pattern], ROOT, log) != 0:
                noticed[mid] = next(iter(failed_tests()), None)
                return False
            cmd += ["-E", pattern]
        if run(cmd, ROOT, log) == 0:
            return True
        names = failed_tests()
        noticed[mid] = next(iter(names), None)
        killers.extend(name for name in names if name not in killers)
        return False

    def tests_pass(mid=None):
        if not args.torch:
            return ctest_pass(mid)
        programs = TORCH_TESTS[mid.split("-")[0]] if mid else all_programs
        return all(run([os.path.join(build, "tests", p)], build, log) == 0 for p in programs)

    if run(configure, ROOT, log) != 0 or run(build_cmd, ROOT, log) != 0:
        sys.exit(f"remat: the unmutated tree does not build (log: {log})")
    if not args.torch:
        listing = subprocess.run(["ctest", "--test-dir", build, "-N"], check=True,
                                 stdout=subprocess.PIPE, text=True).stdout
        names = {line.split(": ", 1)[1].strip() for line in listing.splitlines()
                 if line.lstrip().startswith("Test") and ": " in line}
        for mid, name in KILLED_BY.items():
            if name not in names:
                sys.exit(f"remat: KILLED_BY[{mid!r}]: no test is named {name!r} (update it)")
    if not tests_pass():
        sys.exit(f"remat: the unmutated tree fails its tests (log: {log})")
    survived, skipped = [], []
    for mid, path, old, new, why in mutations:
        if not args.all and not args.only and EXPLAINED.get(mid, "").startswith("equivalent:"):
            skipped.append(mid)
            print(f"{mid:28} {'not run (equivalent)':24} {'':5}    {why}", flush=True)
            continue
        where = locate(tree, path, old)
        if where is None:
            sys.exit(f"remat: mutation {mid}: its text is not found once in {path} (update it)")
        source = os.path.join(tree, where[0])
        original = open(source).read()
        started = time.time()
        open(source, "w").write(mutate(original, where[1], where[2], old, new))
        try:
            if run(build_cmd, ROOT, log) != 0:
                verdict = "killed (does not build)"
            elif not tests_pass(mid):
                verdict = "killed"
            else:
                verdict = "SURVIVED"
                survived.append(mid)
        finally:
            open(source, "w").write(original)
        print(f"{mid:28} {verdict:24} {time.time() - started:5.0f} s  {why}", flush=True)
        if verdict == "SURVIVED" and mid in EXPLAINED:
            print(f"{'':28} {EXPLAINED[mid]}", flush=True)
    with open(os.path.join(work, "killed_by.txt"), "w") as out:
        for mid, name in noticed.items():
            if name:
                out.write(f"    {mid!r}: {name!r},\n")
    killed = len(mutations) - len(survived) - len(skipped)
    print(f"\n{killed} of {len(mutations) - len(skipped)} mutations killed"
          + (f"; survived: {', '.join(survived)}" if survived else "")
          + (f"; not run, equivalent (--all runs them): {', '.join(skipped)}" if skipped else ""))
    unexplained = [mid for mid in survived if mid not in EXPLAINED]
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
