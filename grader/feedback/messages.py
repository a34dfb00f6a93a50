"""The message catalog: every student-facing sentence, in Chinese and English, keyed by outcome.

Logic never builds sentences; it emits model.Note(key, params) and the report renders them here.
Messages under `cause.` and `hint.` carry no values at all: they are the only text hidden checks show.
"""
from __future__ import annotations

import os

LANGS = ("zh", "en")

CATALOG: dict[str, tuple[str, str]] = {
    # --- check titles
    "title.static.all_reduce": ("静态检查：run_worker 调用了 dist.all_reduce", "Static: run_worker calls dist.all_reduce"),
    "title.static.all_gather": ("静态检查：run_worker 调用了 dist.all_gather", "Static: run_worker calls dist.all_gather"),
    "title.runtime.all_reduce": ("{ws} 个进程：All-Reduce 求平均梯度", "{ws} ranks: gradient averaged with all_reduce"),
    "title.runtime.all_gather": ("{ws} 个进程：All-Gather 拼接特征", "{ws} ranks: feature rebuilt with all_gather"),
    "title.hidden.all_reduce": ("隐藏测试：其他进程数下的 All-Reduce", "Hidden: all_reduce at other world sizes"),
    "title.hidden.all_gather": ("隐藏测试：其他进程数下的 All-Gather", "Hidden: all_gather at other world sizes"),
    "title.hidden_n.all_reduce": ("隐藏测试 {n}：其他进程数下的 All-Reduce", "Hidden check {n}: all_reduce at another world size"),
    "title.hidden_n.all_gather": ("隐藏测试 {n}：其他进程数下的 All-Gather", "Hidden check {n}: all_gather at another world size"),
    "title.grader_failed": ("自动评分器出错", "Autograder failed"),
    # --- loading
    "load.no_file": ("文件夹 {folder} 里没有 .py 或 .ipynb 提交文件。", "Folder {folder} holds no .py or .ipynb submission."),
    "load.unreadable": ("无法读取 {file}：{error}", "Cannot read {file}: {error}"),
    "load.too_large": ("{file} 太大（{size} 字节），不像是本练习的答案。", "{file} is too large ({size} bytes) to be a solution to this exercise."),
    "load.not_utf8": ("{file} 不是 UTF-8 编码（第 {offset} 个字节处）。请用 UTF-8 保存后重新提交。",
                      "{file} is not UTF-8 text (at byte {offset}). Save it as UTF-8 and submit again."),
    "load.bad_notebook": ("Notebook 文件已损坏，无法读取：{error}", "The notebook is corrupt and cannot be read: {error}"),
    "load.no_code_cells": ("Notebook 里没有代码单元格。", "The notebook has no code cells."),
    "load.empty": ("{file} 是空的：请补全 run_worker 后提交。", "{file} is empty: complete run_worker and submit it."),
    "load.split_entry": ("run_worker 被拆到了多个单元格里，中间夹着其他顶层代码（第 {line} 行）。请把整个函数放在同一个单元格中。",
                         "run_worker is split over several cells with other top-level code in between (line {line}). Keep the whole function in one cell."),
    # --- static
    "static.syntax_error": ("语法错误，第 {line} 行：{message}", "Syntax error at line {line}: {message}"),
    "static.no_entry": ("没有找到函数 run_worker(rank, world_size)。请不要修改函数名。",
                        "No function run_worker(rank, world_size) was found. Keep the function's name."),
    "static.called": ("run_worker 调用了 dist.{op}（第 {lines} 行）。", "run_worker calls dist.{op} (line {lines})."),
    "static.not_called": ("run_worker 没有调用 dist.{op}：只出现在注释、字符串或不会执行的分支里的调用不算。",
                          "run_worker never calls dist.{op}: calls that only appear in comments, strings or dead branches do not count."),
    "static.todo": ("run_worker 仍然抛出 NotImplementedError：请先完成 TODO 1（all_reduce）和 TODO 2（all_gather）。",
                    "run_worker still raises NotImplementedError: complete TODO 1 (all_reduce) and TODO 2 (all_gather) first."),
    # --- passes
    "pass.static": ("通过。", "Passed."),
    "pass.runtime": ("通过：每个进程上的结果都正确，并且确实来自 dist.{op}。",
                     "Passed: every rank's result is right and really came through dist.{op}."),
    # --- why a rank failed (visible checks)
    "fail.load_error": ("进程 {rank} 加载你的代码时出错：{type}: {message}（{where}）",
                        "Rank {rank} failed while loading your code: {type}: {message} ({where})"),
    "fail.todo": ("进程 {rank}：run_worker 抛出了 NotImplementedError，TODO 还没有完成。",
                  "Rank {rank}: run_worker raised NotImplementedError: the TODOs are not done yet."),
    "fail.exception": ("进程 {rank} 在 run_worker 中抛出异常 {type}: {message}（{where}）",
                       "Rank {rank} raised {type}: {message} in run_worker ({where})"),
    "fail.sys_exit": ("进程 {rank} 在 run_worker 中调用了 sys.exit({code})，没有返回结果。",
                      "Rank {rank} called sys.exit({code}) inside run_worker and returned nothing."),
    "fail.os_exit": ("进程 {rank} 在返回结果之前退出了（退出码 {code}，例如 os._exit）。",
                     "Rank {rank} exited (code {code}, e.g. os._exit) before returning its results."),
    "fail.signal": ("进程 {rank} 被信号 {signal}（{name}）终止。", "Rank {rank} was killed by signal {signal} ({name})."),
    "fail.memory": ("进程 {rank} 超出了内存限制。", "Rank {rank} went over its memory limit."),
    "fail.cpu": ("进程 {rank} 超出了 CPU 时间限制。", "Rank {rank} went over its CPU time limit."),
    "fail.file_size": ("进程 {rank} 写入的文件超出了大小限制。", "Rank {rank} wrote a file over the size limit."),
    "fail.processes": ("进程 {rank} 创建了太多进程或线程（进程数限制）。", "Rank {rank} started too many processes or threads (process limit)."),
    "fail.output": ("进程 {rank} 的输出太多，超出了输出限制，运行被停止。", "Rank {rank} printed too much: the run was stopped at the output limit."),
    "fail.timeout_inside": ("超时：进程 {rank} 卡在第 {n} 次 {op} 调用里，等待其他进程参与。",
                            "Time limit: rank {rank} was stuck inside {op} (call #{n}), waiting for the other ranks."),
    "fail.timeout_outside": ("超时：进程 {rank} 在集合通信之外一直没有结束（死循环或等待？）。",
                             "Time limit: rank {rank} never finished, outside any collective (an endless loop or a wait?)."),
    "fail.deadlock_inside": ("死锁：进程 {rank} 在第 {n} 次 {op} 调用里等待，但其他进程已经不会再调用它。",
                             "Deadlock: rank {rank} waits inside {op} (call #{n}) that the other ranks will never call."),
    "fail.deadlock_outside": ("死锁：进程 {rank} 没有结束。", "Deadlock: rank {rank} did not finish."),
    "fail.stopped": ("进程 {rank} 被提前停止，因为进程 {other} 已经失败。", "Rank {rank} was stopped because rank {other} had failed."),
    "fail.grader": ("进程 {rank}：评分器没有收到结果（评分器问题，请联系助教）。", "Rank {rank}: the grader received no result (a grader problem: tell your TA)."),
    "fail.grader_run": ("评分器无法完成这次运行：{error}", "The grader could not complete this run: {error}"),
    "fail.missing": ("进程 {rank}：找不到 {quantity}。run_worker 应当 return (gradient, full_feature)，或者使用名为 gradient 和 full_feature 的变量（实际返回了 {returned}）。",
                     "Rank {rank}: no {quantity} was found. run_worker should return (gradient, full_feature), or keep them in variables named gradient and full_feature (it returned {returned})."),
    "fail.not_collective": ("进程 {rank}：结果的数值是对的，但并不是通过 dist.{op} 得到的（评分器改变了通信的数据，你的结果没有随之变化）。请用集合通信的结果，不要在本地直接算出答案。",
                            "Rank {rank}: the numbers are right but did not come through dist.{op} (the grader changed the data in flight and your result did not follow). Use what the collective returns instead of computing the answer locally."),
    "fail.async_no_wait": ("进程 {rank}：dist.{op} 用 async_op=True 发起后没有调用 wait()，读到的结果不可靠（这次碰巧是对的也不算）。请调用 work.wait() 后再使用结果。",
                           "Rank {rank}: dist.{op} was started with async_op=True and never wait()ed, so reading its result is a race (right by luck does not count). Call work.wait() before using the result."),
    "fail.unobserved": ("进程 {rank}：无法确认结果来自 dist.{op}。请 return (gradient, full_feature)。",
                        "Rank {rank}: the grader could not confirm the result came through dist.{op}. Return (gradient, full_feature)."),
    # --- what is wrong with a value
    "detail.not_tensor": ("进程 {rank}：{quantity} 不是 torch.Tensor。", "Rank {rank}: {quantity} is not a torch.Tensor."),
    "detail.subclass": ("进程 {rank}：{quantity} 是 torch.Tensor 的子类，请返回普通的 torch.Tensor。",
                        "Rank {rank}: {quantity} is a subclass of torch.Tensor; return a plain torch.Tensor."),
    "detail.dtype": ("进程 {rank}：{quantity} 的 dtype 不是浮点类型。", "Rank {rank}: {quantity} does not have a floating dtype."),
    "detail.shape": ("进程 {rank}：{quantity} 的形状不对。", "Rank {rank}: {quantity} has the wrong shape."),
    "detail.values": ("进程 {rank}：{quantity} 的数值不对。", "Rank {rank}: {quantity} has wrong values."),
    "detail.last_collective": ("  进程 {rank} 最后进入的集合通信：第 {n} 次 {op}。", "  Rank {rank} had last entered {op} (call #{n})."),
    "detail.no_collective": ("  进程 {rank} 此前没有进入任何集合通信。", "  Rank {rank} had not entered any collective."),
    "detail.rank_value": ("  进程 {rank} 的 {quantity}：期望形状 {expected_shape}、数值 {expected}；实际形状 {shape}、dtype {dtype}、数值 {values}",
                          "  rank {rank} {quantity}: expected shape {expected_shape}, values {expected}; got shape {shape}, dtype {dtype}, values {values}"),
    # --- causes (no values: hidden checks show these)
    "cause.summed_not_averaged": ("原因：梯度是平均值的 world_size 倍——all_reduce（SUM）之后还要除以 world_size。",
                                  "Cause: the gradient is world_size times too large: after all_reduce (SUM), divide by world_size."),
    "cause.unchanged": ("原因：结果和本进程的输入一样，说明 {op} 的结果没有被使用（例如 t = dist.{op}(t) 会得到 None，async_op=True 时没有 wait()）。",
                        "Cause: the result equals this rank's own input, so the {op} result was not used (t = dist.{op}(t) gives None; async_op=True needs wait())."),
    "cause.hardcoded_ws": ("原因：在某个进程数下正确、在其他进程数下错误——不要把 world_size 写死成常数，请使用参数 world_size。",
                           "Cause: right at one world size and wrong at another: do not hard-code the world size, use the world_size argument."),
    "cause.reduce_not_all_reduce": ("原因：调用的是 dist.reduce，只有目标进程拿到总和；应使用 dist.all_reduce，让每个进程都拿到结果。",
                                    "Cause: dist.reduce leaves the sum on the destination rank only; use dist.all_reduce so every rank gets it."),
    "cause.integer_dtype": ("原因：梯度是整数张量（torch.full((n,), rank + 1) 的 dtype 是 int64），原地除法会失败或截断。请用 float(rank + 1) 或 dtype=torch.float32。",
                            "Cause: the gradient is an integer tensor (torch.full((n,), rank + 1) is int64), so in-place division fails or truncates. Use float(rank + 1) or dtype=torch.float32."),
    "cause.feature_integer_dtype": ("原因：特征是整数张量（torch.full((128,), rank) 的 dtype 是 int64）。请用 float(rank) 或 dtype=torch.float32。",
                                    "Cause: the feature is an integer tensor (torch.full((128,), rank) is int64). Use float(rank) or dtype=torch.float32."),
    "cause.stack_not_cat": ("原因：用了 torch.stack，得到二维张量；应使用 torch.cat(gathered_list, dim=0) 拼成一维向量。",
                            "Cause: torch.stack gives a 2-D tensor; use torch.cat(gathered_list, dim=0) to build one vector."),
    "cause.gather_list_size": ("原因：all_gather 的输出列表长度必须等于 world_size（每个进程一个缓冲区）。",
                               "Cause: the all_gather output list must hold exactly world_size buffers, one per rank."),
    "cause.shared_buffers": ("原因：输出列表里的缓冲区共享同一块内存（例如 [buf] * world_size），每个位置最后都是最后一个进程的数据。请为每个进程创建独立的张量。",
                             "Cause: the output buffers share memory (e.g. [buf] * world_size), so every slot ends with the last rank's data. Make one tensor per rank."),
    "cause.mismatch": ("原因：各进程调用的集合通信不一致（每个进程必须按相同顺序、用相同大小调用同样的集合通信；gloo 可能把不同的调用错配在一起，得到错误结果、卡住或崩溃）。各进程依次调用了：{calls}",
                       "Cause: the ranks did not call the same collectives (every rank must make the same calls, in the same order, with the same sizes; gloo may pair mismatched calls and return garbage, hang or abort). In order, {calls}"),
    "cause.mismatch_generic": ("原因：各进程调用的集合通信不一致（例如只有部分进程调用了某个集合通信）。每个进程必须按相同顺序调用同样的集合通信。",
                               "Cause: the ranks did not call the same collectives (e.g. a collective that only some ranks call). Every rank must make the same calls in the same order."),
    "cause.assigned_none": ("原因：dist.{op} 是原地操作，返回 None（只有 async_op=True 时返回一个 work 对象）；t = dist.{op}(...) 会把变量变成 None。直接调用 dist.{op}(...)，然后使用原来的张量。",
                            "Cause: dist.{op} works in place and returns None (a work handle only with async_op=True), so t = dist.{op}(...) leaves None in t. Call dist.{op}(...) on its own and keep using the tensors you passed."),
    "cause.async_no_wait": ("原因：async_op=True 发起的通信没有调用 wait()，结果可能还没到。",
                            "Cause: a collective started with async_op=True was never wait()ed, so its result may not have arrived."),
    # --- hints for hidden checks, by outcome (no values, no code)
    "hint.wrong": ("结果不正确。", "The result is wrong."),
    "hint.missing": ("没有得到结果：请 return (gradient, full_feature)。", "No result: return (gradient, full_feature)."),
    "hint.bad_type": ("结果不是普通的 torch.Tensor。", "The result is not a plain torch.Tensor."),
    "hint.exception": ("run_worker 在这个测试中抛出了异常。", "run_worker raised an exception in this test."),
    "hint.timeout": ("运行超时：可能有进程卡在集合通信里，或者死循环。", "Time limit: a rank hung inside a collective or looped forever."),
    "hint.deadlock": ("死锁：各进程调用的集合通信不一致。", "Deadlock: the ranks did not call the same collectives."),
    "hint.not_collective": ("结果不是通过集合通信得到的。", "The result did not come through the collective."),
    "hint.limit": ("运行超出了资源限制（内存、CPU、输出或进程数）。", "The run went over a resource limit (memory, CPU, output or processes)."),
    "hint.crash": ("有进程崩溃或提前退出。", "A rank crashed or exited early."),
    "hint.todo": ("TODO 还没有完成。", "The TODOs are not done yet."),
    "hint.not_submitted": ("没有可以评分的代码。", "There is no code to grade."),
    "hint.grader_error": ("评分器出错，请联系助教。", "The grader failed: tell your TA."),
    # --- report
    "summary.score": ("得分：{score:g} / {max_score:g}", "Score: {score:g} / {max_score:g}"),
    "summary.hidden_pending": ("另有 {count} 项隐藏测试，成绩公布后可见。", "{count} hidden checks are shown once grades are published."),
    "summary.grader_failed": ("自动评分器出错，本次成绩记为 0 分，请联系助教。", "The autograder failed; this grade is 0 until a TA looks at it."),
    "summary.layers": ("沙箱：{layers}", "Sandbox: {layers}"),
    "layer.rlimits": ("资源限制（rlimits）", "rlimits"),
    "layer.process_group": ("独立进程组", "process group"),
    "layer.uid": ("非特权用户（unprivileged uid）", "unprivileged uid"),
    "layer.pid_ns": ("PID 命名空间（pid namespace）", "pid namespace"),
    "layer.net_ns": ("网络命名空间，仅回环（network namespace）", "network namespace (loopback only)"),
    "layer.private_tmp": ("私有 /tmp（private /tmp）", "private /tmp"),
    "layer.fresh_proc": ("独立的 /proc", "fresh /proc"),
    "layer.user_ns": ("用户命名空间（user namespace）", "user namespace"),
    "layer.memory_cgroup": ("内存 cgroup（所有进程共 {mb} MiB）", "memory cgroup ({mb} MiB for all ranks)"),
    "summary.output": ("进程 {rank} 的输出（前 {kept} 字节，共 {total} 字节）：", "Output of rank {rank} (first {kept} of {total} bytes):"),
    "teach.header": ("通信开销（{ws} 个进程，{backend}）：", "Communication cost ({ws} ranks, {backend}):"),
    "teach.collective": ("  进程 {rank} {op}：{ms:.2f} ms；数据 {size} 字节，环形算法每个进程发送约 {volume} 字节（{formula}），约 {bandwidth}",
                         "  rank {rank} {op}: {ms:.2f} ms; {size} bytes of data, a ring sends about {volume} bytes per rank ({formula}), about {bandwidth}"),
    "status.passed": ("通过", "passed"),
    "status.failed": ("未通过", "failed"),
    # --- batch (for TAs)
    "batch.verdicts": ("结论统计：", "Verdicts:"),
    "batch.mean_median": ("{count} 份提交：平均分 {mean:.1f}，中位数 {median:g}（满分 {max:g}）",
                          "{count} submissions: mean {mean:.1f}, median {median:g} (out of {max:g})"),
    "batch.histogram": ("总分分布：", "Totals:"),
    "batch.done": ("本次评分 {graded} 份，沿用已有结果 {reused} 份，清理临时文件 {swept} 个，用时 {seconds:.1f} 秒。成绩表：{csv}",
                   "Graded {graded}, reused {reused} up-to-date results, swept {swept} temporary files, in {seconds:.1f} s. Gradebook: {csv}"),
    "backend.nccl_unavailable": ("NCCL 需要至少 {ws} 张可见的 GPU，当前只有 {gpus} 张。", "NCCL needs at least {ws} visible GPUs; {gpus} are visible."),
    # --- sandbox and batch input (issue 10)
    "layer.uid_per_run": ("非特权用户，每次运行使用新的 uid", "unprivileged uid, a new one for every run"),
    "layer.ipc_ns": ("IPC 命名空间", "ipc namespace"),
    "layer.new_root": ("独立的根目录：只有解释器和它的库（只读）", "own root: only the interpreter and its libraries, read-only"),
    "layer.tmpfs": ("每次运行独立的 /tmp（tmpfs，{mb} MiB）", "own /tmp for each run (tmpfs, {mb} MiB)"),
    "layer.no_namespaces": ("没有命名空间：进程能看到本机的文件（此机器不支持，或使用了 --no-sandbox）",
                            "no namespaces: ranks see this machine's files (not available here, or --no-sandbox)"),
    "layer.no_new_privs": ("禁止提权（no_new_privs）", "no_new_privs"),
    "layer.no_new_privs_off": ("未启用禁止提权（no_new_privs）", "no_new_privs not applied"),
    "layer.seccomp": ("seccomp 系统调用过滤", "seccomp system call filter"),
    "layer.seccomp_off": ("未启用 seccomp 系统调用过滤", "no seccomp filter"),
    "load.too_deep": ("{file} 所在的文件夹层级太深（超过 {limit} 层），无法评分。",
                      "{file} lies in folders nested too deep (more than {limit} levels) to grade."),
    "load.not_a_file": ("{file} 不是普通文件（{kind}），无法评分。", "{file} is not a regular file ({kind}) and cannot be graded."),
    "load.symlink": ("{file} 是符号链接，不会被跟随；请提交文件本身。", "{file} is a symbolic link, which is not followed: submit the file itself."),
    "static.too_complex": ("代码中有嵌套过深的表达式，Python 无法解析：{message}",
                           "The code holds an expression nested too deep for Python to parse: {message}"),
    "static.parse_memory": ("解析代码时内存不足：代码过大或嵌套过深。", "Parsing the code ran out of memory: the code is too large or nested too deep."),
    "note.magic_ignored": ("第 {cell} 个代码单元格以 %%{magic} 开头，它不是 Python 代码，评分时被忽略。",
                           "Code cell {cell} starts with %%{magic}, which is not Python: it was left out of grading."),
    "note.magic_local": ("第 {cell} 个代码单元格以 %%{magic} 开头：它在单独的作用域中运行单元格，其中定义的内容不会保留，因此评分时被忽略。",
                         "Code cell {cell} starts with %%{magic}, which runs the cell in a scope of its own: nothing it defines is kept, so it was left out of grading."),
    "note.magics_unavailable": ("评分环境没有安装 IPython：第 {line} 行的 %{magic} 没有运行，按注释处理。",
                                "IPython is not installed where this was graded: the %{magic} at line {line} was not run but read as a comment."),
    "batch.entry_failed": ("评分 {name} 时出错：{error}", "Grading {name} failed: {error}"),
}


def layer(layer_id: str, lang: str) -> str:
    """A sandbox layer id ("pid_ns", "memory_cgroup:2048") in words."""
    name, _, value = layer_id.partition(":")
    return render(f"layer.{name}", {"mb": value}, lang)


def default_lang() -> str:
    lang = os.environ.get("LANG", "") or os.environ.get("LC_ALL", "")
    return "en" if lang.lower().startswith("en") else "zh"


def render(key: str, params: dict | None = None, lang: str = "zh") -> str:
    zh, en = CATALOG.get(key, (key, key))
    template = en if lang == "en" else zh
    try:
        return template.format(**(params or {}))
    except (KeyError, IndexError, ValueError):
        return template
