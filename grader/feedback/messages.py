"""The message catalog: every sentence the engine says, in Chinese and English, keyed by outcome.

Logic never builds sentences; it emits model.Note(key, params) and the report renders them here.
Chinese text is Chinese throughout (full-width punctuation; code identifiers stay as code). Structured
parameters are worded here too: an exception's frames, a listing of operations per rank, Words.
An exercise adds its own keys (spec.Exercise.messages) under its name: `<exercise>.<key>`.
"""
from __future__ import annotations

import os
import re

from ..model import CellLines, Words

LANGS = ("zh", "en")

CATALOG: dict[str, tuple[str, str]] = {
    # --- titles
    "title.hidden": ("隐藏测试 {n}：{what}", "Hidden check {n}: {what}"),
    "title.grader_failed": ("自动评分器出错", "Autograder failed"),
    # --- which exercise
    "exercise.none": ("没有找到任何练习（solutions/*/exercise.py）。", "No exercise was found (solutions/*/exercise.py)."),
    "exercise.unknown": ("没有名为 {name} 的练习。现有练习：{known}。", "There is no exercise called {name}. Exercises: {known}."),
    "exercise.ambiguous": ("无法判断这份提交属于哪个练习，请用 --exercise 指定（现有练习：{known}）。",
                           "Cannot tell which exercise this submission is for: choose one with --exercise (exercises: {known})."),
    "exercise.broken": ("练习定义 {path} 无法加载：{error}", "The exercise definition {path} cannot be loaded: {error}"),
    # --- an exercise's declaration (issue 20): exercise/validate.py; the place (file:line) is said before
    "exercise.no_declaration": ("没有定义 EXERCISE = Exercise(...)", "no EXERCISE = Exercise(...)"),
    "gradescope.written": ("已写入 {path}（在 Gradescope 的编程作业里把它上传为 autograder）。",
                           "wrote {path} (upload it as the autograder of a Gradescope programming assignment)"),
    "exercise.name_required": ("请用 --exercise 指定要打包的练习（现有练习：{known}）。",
                               "Name the exercise to package with --exercise (exercises: {known})."),
    "declare.name": ("{what} 的名字必须是 Python 标识符，而不是 {value}。", "{what}: the name must be a Python identifier, not {value}."),
    "declare.words": ("{what} 必须是两个字符串（中文，English），而不是 {value}。", "{what} must be two strings (zh, en), not {value}."),
    "declare.not_tuple": ("{what} 必须是操作名的元组，例如 (\"all_reduce\",)，而不是 {value}。",
                          "{what} must be a tuple of operation names, such as (\"all_reduce\",), not {value}."),
    "declare.unknown_op": ("{what} 里的 {name} 不是 grader.comm.OPS 中的操作名（可用：{known}）。",
                           "{what}: {name} is not an operation of grader.comm.OPS (known: {known})."),
    "declare.unknown_op_near": ("{what} 里的 {name} 不是 grader.comm.OPS 中的操作名：是不是 {near}？",
                                "{what}: {name} is not an operation of grader.comm.OPS: did you mean {near}?"),
    "declare.combine": ("量 {name} 的 combine 必须是 {known} 之一，而不是 {value}。",
                        "Quantity {name}: combine must be one of {known}, not {value}."),
    "declare.needs_function": ("量 {name} 的 combine={combine} 需要 {field}。", "Quantity {name}: combine={combine} needs {field}."),
    "declare.own_needs_context": ("量 {name} 的 combine=\"own\" 要证明来源，需要 context=True 和 local(rank, ws, ctx)。",
                                  "Quantity {name}: combine=\"own\" with provenance needs context=True and local(rank, ws, ctx)."),
    "declare.not_callable": ("量 {name} 的 {field} 必须是函数，而不是 {value}。", "Quantity {name}: {field} must be a function, not {value}."),
    "declare.local_wants_context": (
        "量 {name} 的 local{signature} 需要 3 个位置参数，但它会以 local(rank, ws) 调用：第三个参数若是运行上下文（ctx），请声明 context=True。",
        "Quantity {name}: local{signature} needs 3 positional arguments but is called as local(rank, ws): if the third is the "
        "run context (ctx), declare context=True."),
    "declare.signature": ("量 {name} 的 {field}{signature} 不能以 {call} 调用：必需的位置参数要与声明相符。",
                          "Quantity {name}: {field}{signature} cannot be called as {call}: its required positional "
                          "parameters must fit the declaration."),
    "declare.unknown_kind": ("检查 {id} 的种类 {kind} 不存在（可用：{known}）。", "Check {id}: there is no kind {kind} (kinds: {known})."),
    "declare.points": ("检查 {id} 的分数必须是非负数，而不是 {value}。", "Check {id}: points must be a non-negative number, not {value}."),
    "declare.world_size": ("检查 {id} 的 world_size 必须是正整数，而不是 {value}。",
                           "Check {id}: world_size must be a positive integer, not {value}."),
    "declare.needs": ("检查 {id}（{kind}）需要 {field}。", "Check {id} ({kind}) needs {field}."),
    "declare.params": ("检查 {id} 的 {field} 不对：{value}。", "Check {id} has a wrong {field}: {value}."),
    "declare.dtype": ("{what} 不是已知的 dtype：{value}（例如 {known}）。", "{what} is not a known dtype: {value} (such as {known})."),
    "declare.duplicate": ("{what} {name} 声明了不止一次。", "{what} {name} is declared more than once."),
    "declare.missing_quantity": ("{what} 指向的量 {name} 没有声明（已声明：{known}）。",
                                 "{what} names the quantity {name}, which is not declared (quantities: {known})."),
    "declare.items": ("{what} 必须是 {kind}(...) 的元组。", "{what} must be a tuple of {kind}(...)."),
    "declare.todo": ("Exercise.todo 必须是两个字符串（中文，English），或者 Todo(...) 的元组，而不是 {value}。",
                     "Exercise.todo must be two strings (zh, en) or a tuple of Todo(...), not {value}."),
    "todo.open": ("请先完成 {todos}", "complete {todos} first"),
    "list.and": ("{rest}、{last}", "{rest} and {last}"),
    "list.broken": ("  {name}：无法加载：{path}：{error}", "  {name}: broken: {path}: {error}"),
    # --- the release of student versions (integrations/release.py): refused where it would leak an answer
    "release.no_region": ("{where}：没有 {begin} / {end} 区域，学生版本会原样含有整个答案。什么都没有发布。",
                          "{where}: no {begin} / {end} region: the student version would hold the whole "
                          "answer. Nothing was released."),
    "release.stray_marker": ("{where}：{text} 不是发布能识别的标记（{marker} 必须单独成行，一字不差），学生版本仍会含有这段内容。"
                             "什么都没有发布。",
                             "{where}: {text} is not a marker the release recognises ({marker} stands alone on its line, "
                             "spelt exactly so): the student version would still hold this region. Nothing was released."),
    "release.nested": ("{where}：{begin} 出现在另一个答案区域（第 {opened} 行开始）里面。什么都没有发布。",
                       "{where}: {begin} inside another solution region (opened at line {opened}). Nothing was released."),
    "release.unopened": ("{where}：{end} 之前没有 {begin}。什么都没有发布。",
                         "{where}: {end} with no {begin} before it. Nothing was released."),
    "release.unclosed": ("{where}：这个 {begin} 没有对应的 {end}。什么都没有发布。",
                         "{where}: this {begin} is never closed by {end}. Nothing was released."),
    # --- loading
    "load.no_file": ("文件夹 {folder} 里没有 .py 或 .ipynb 提交文件。", "Folder {folder} holds no .py or .ipynb submission."),
    "load.unreadable": ("无法读取 {file}：{error}", "Cannot read {file}: {error}"),
    "load.too_large": ("{file} 太大（{size} 字节），不像是本练习的答案。", "{file} is too large ({size} bytes) to be a solution to this exercise."),
    "load.not_utf8": ("{file} 不是 UTF-8 编码（第 {offset} 个字节处）。请用 UTF-8 保存后重新提交。",
                      "{file} is not UTF-8 text (at byte {offset}). Save it as UTF-8 and submit again."),
    "load.bad_notebook": ("Notebook 文件已损坏，无法读取：{error}", "The notebook is corrupt and cannot be read: {error}"),
    "load.no_code_cells": ("Notebook 里没有代码单元格。", "The notebook has no code cells."),
    "load.empty": ("{file} 是空的：请补全代码后提交。", "{file} is empty: complete the code and submit it."),
    "load.split_entry": ("入口函数被拆到了多个单元格里，中间夹着其他顶层代码（第 {line} 行）。请把整个函数放在同一个单元格中。",
                         "The entry function is split over several cells with other top-level code in between (line {line}). Keep the whole function in one cell."),
    # --- static
    "static.syntax_error": ("语法错误，第 {line} 行：{message}", "Syntax error at line {line}: {message}"),
    "static.no_entry": ("没有找到函数 {entry}(rank, world_size)。请不要修改函数名。",
                        "No function {entry}(rank, world_size) was found. Keep the function's name."),
    "static.no_entry_any": ("代码里没有定义任何练习的入口函数（{entries}）。请不要修改函数名。",
                            "The code defines none of the functions the exercises start from ({entries}). Keep the function's name."),
    "static.called": ("{entry} 用到了 {op}（第 {lines} 行）。", "{entry} reaches {op} (line {lines})."),
    "static.not_called": ("{entry} 没有用到 {op}：只出现在注释、字符串或不会执行的分支里的调用不算。",
                          "{entry} never reaches {op}: calls that only appear in comments, strings or dead branches do not count."),
    "static.not_written": ("{entry} 没有调用 {op}。", "{entry} never calls {op}."),
    "static.todo": ("{entry} 仍然抛出 NotImplementedError：{todo}。", "{entry} still raises NotImplementedError: {todo}."),
    "static.todo_raise": ("{entry} 仍然抛出 NotImplementedError：完成 TODO 之后，请删掉 raise NotImplementedError(...) 这一行。",
                          "{entry} still raises NotImplementedError: once the TODOs are done, delete the "
                          "raise NotImplementedError(...) line."),
    "static.forbidden": ("本练习不允许使用 {op}（第 {lines} 行）。", "This exercise does not allow {op} (line {lines})."),
    "static.forbidden_at_run": ("代码里看不出 {op}，但运行时调用了它（第 {line} 行）：不允许的操作，无论怎样调用都不允许。",
                                "The code does not name {op}, but it ran (line {line}): an operation that is not allowed is not allowed however it is called."),
    "static.called_at_run": ("{entry} 在运行时用到了 {op}（第 {line} 行，经由 {api}）：代码里看不出这个调用，但每个进程都完成了它。",
                             "{entry} reaches {op} at run time (line {line}, through {api}): the code does not show the call, but every rank completed it."),
    "static.not_used": ("没有使用 {ops}。", "None of {ops} is used."),
    # --- passes
    "pass.value": ("通过：每个进程上的 {quantity} 都正确，并且确实来自 {ops} 传来的数据，每个进程都贡献了自己的数据。",
                   "Passed: {quantity} is right on every rank, derived from what {ops} delivered, with every rank contributing its own data."),
    "pass.uses": ("通过：使用了 {ops}，没有使用不允许的操作。", "Passed: {ops} used, and no operation the exercise does not allow."),
    # --- why a rank failed (visible checks)
    "fail.load_error": ("进程 {rank} 加载你的代码时出错：{type}: {message}（{frames}）",
                        "Rank {rank} failed while loading your code: {type}: {message} ({frames})"),
    "fail.todo": ("进程 {rank}：代码抛出了 NotImplementedError，TODO 还没有完成。",
                  "Rank {rank}: your code raised NotImplementedError: the TODOs are not done yet."),
    "fail.exception": ("进程 {rank} 抛出异常 {type}: {message}（{frames}）",
                       "Rank {rank} raised {type}: {message} ({frames})"),
    "fail.mismatch_raised": ("进程 {rank} 抛出异常 {type}：它的 {op} 无法与其他进程的调用配对，各进程调用的通信操作不一致（或形状不同）（{frames}）",
                             "Rank {rank} raised {type}: its {op} could not be paired with the other ranks' calls, since the "
                             "ranks called different operations, or the same one with different shapes ({frames})"),
    "fail.sys_exit": ("进程 {rank} 调用了 sys.exit({code})，没有返回结果。",
                      "Rank {rank} called sys.exit({code}) and returned nothing."),
    "fail.os_exit": ("进程 {rank} 在返回结果之前退出了（退出码 {code}，例如 os._exit）。",
                     "Rank {rank} exited (code {code}, e.g. os._exit) before returning its results."),
    "fail.signal": ("进程 {rank} 被信号 {signal}（{name}）终止。", "Rank {rank} was killed by signal {signal} ({name})."),
    "fail.memory": ("进程 {rank} 超出了内存限制。", "Rank {rank} went over its memory limit."),
    "fail.cpu": ("进程 {rank} 超出了 CPU 时间限制。", "Rank {rank} went over its CPU time limit."),
    "fail.file_size": ("进程 {rank} 写入的文件超出了大小限制。", "Rank {rank} wrote a file over the size limit."),
    "fail.processes": ("进程 {rank} 创建了太多进程或线程（进程数限制）。", "Rank {rank} started too many processes or threads (process limit)."),
    "fail.traffic": ("进程 {rank} 经评分器的交换机传递的数据或通信次数超出了一次运行的上限（或一次操作要求的输出过大），运行被停止。",
                     "Rank {rank} passed more data, or more operations, through the grader's switch than a run allows (or asked one operation for too large an output): the run was stopped."),
    "fail.unread": ("进程 {rank} 不再读取评分器交换机发给它的结果（它的操作的结果越积越多），运行被停止。",
                    "Rank {rank} stopped reading what the grader's switch sent it (the answers of its operations piled up): the run was stopped."),
    "fail.broken": ("进程 {rank} 的代码破坏了评分器在进程里的部分（例如改写了它用到的模块），评分器因此无法读取它的结果：{error}",
                    "Rank {rank}'s code broke the grader's part of the rank (it replaced a module the grader uses, say), so its results could not be read: {error}"),
    "fail.protocol": ("进程 {rank} 向评分器发送了正常代码不会发送的数据（直接写入评分器的通信通道？），运行被停止。",
                      "Rank {rank} sent the grader what no ordinary code sends (written straight onto the grader's channel?): the run was stopped."),
    "fail.output": ("进程 {rank} 的输出太多，超出了输出限制，运行被停止。", "Rank {rank} printed too much: the run was stopped at the output limit."),
    "fail.timeout_inside": ("超时：进程 {rank} 卡在第 {n} 个通信操作 {op}（第 {line} 行）里，等待其他进程。",
                            "Time limit: rank {rank} was stuck in its operation #{n}, {op} (line {line}), waiting for the other ranks."),
    "fail.timeout_outside": ("超时：进程 {rank} 在通信操作之外一直没有结束（死循环或等待？）。",
                             "Time limit: rank {rank} never finished, outside any communication (an endless loop or a wait?)."),
    "fail.timeout_real": ("超时：进程 {rank} 没有结束；它最后调用的通信操作是 {op}（第 {line} 行）。",
                          "Time limit: rank {rank} never finished; the last communication it called was {op} (line {line})."),
    "cause.isend_not_waited": ("原因：进程 {rank} 从没有 wait() 过它的 isend（第 {line} 行）返回的请求。在 gloo 上，如果请求在接收方发出 recv 之前就被丢弃，这条消息永远不会送达（它的缓冲区随请求一起释放），接收方便一直等下去。请保存请求（req = dist.isend(...)），在接收完成后调用 req.wait()。",
                               "Cause: rank {rank} never waited on the request its isend (line {line}) returned. On gloo, a request dropped before the receiver posts its recv is never delivered (its buffer is freed with the request), so the receiver waits forever. Keep the request (req = dist.isend(...)) and call req.wait() once the receive is done."),
    "fail.deadlock_inside": ("死锁：进程 {rank} 在第 {n} 个通信操作 {op}（第 {line} 行）里等待，但其他进程的操作永远不会与它配对。",
                             "Deadlock: rank {rank} waits in its operation #{n}, {op} (line {line}), which no operation of the other ranks will ever match."),
    "fail.deadlock_outside": ("死锁：进程 {rank} 没有结束。", "Deadlock: rank {rank} did not finish."),
    "fail.stopped": ("进程 {rank} 被提前停止，因为进程 {other} 已经失败。", "Rank {rank} was stopped because rank {other} had failed."),
    "fail.grader": ("进程 {rank}：评分器没有收到结果（评分器问题，请联系助教）。", "Rank {rank}: the grader received no result (a grader problem: tell your TA)."),
    "fail.grader_run": ("评分器无法完成这次运行：{error}", "The grader could not complete this run: {error}"),
    "fail.missing": ("进程 {rank}：找不到 {quantity}。{entry} 应当返回 {names}，或者把它们保存在同名的变量里（实际返回了 {returned}）。",
                     "Rank {rank}: no {quantity} was found. {entry} should return {names}, or keep them in variables of those names (it returned {returned})."),
    "fail.not_collective": ("进程 {rank}：{quantity} 的数值是对的，但不是由 {ops} 传来的数据得到的（评分器秘密地改变了通信中的数据，你的结果没有随之变化）。请使用通信的结果，不要在本地直接算出答案。",
                            "Rank {rank}: {quantity} has the right numbers, but they were not derived from what {ops} delivered (the grader secretly changed the data in flight and your result did not follow). Use what the communication returns instead of computing the answer locally."),
    "fail.not_collective_derived": ("进程 {rank}：{quantity} 的数值是对的，也随通信中的数据而变，但它不是 {ops} 传来的、由每个进程自己的数据组成的结果"
                                    "（评分器秘密地改变了通信中的数据，你的结果没有按通信应有的方式随之变化）：它是用传来的数据以另一种方式算出来的。",
                                    "Rank {rank}: {quantity} has the right numbers and follows the data in flight, but it is not what {ops} "
                                    "delivered, made of every rank's own data (the grader secretly changed the data in flight, and your result "
                                    "did not follow it as the communication would): it was computed from that data in another way."),
    "fail.not_collective_untraced": ("进程 {rank}：{quantity} 的数值是对的，但评分器无法确认它来自 {ops} 传来的数据、由每个进程自己的数据组成"
                                     "（评分器秘密地改变了通信中的数据，你的结果没有随之变化）。",
                                     "Rank {rank}: {quantity} has the right numbers, but the grader could not trace them to what {ops} "
                                     "delivered, made of every rank's own data (the grader secretly changed the data in flight and your "
                                     "result did not follow it)."),
    "fail.overflowed": ("进程 {rank}：{quantity} 的数值是对的，但在评分器改动过数据的那次运行里，{ops} 的求和超出了数据类型能表示的最大值（inf），评分器因此无法确认它的来源：你的求和已经接近上限（float16 最大约 65504，超过它的 4/5 就不安全），请把损失缩放系数调小。",
                        "Rank {rank}: {quantity} has the right numbers, but in the grader's run with changed data the sum in {ops} went past its dtype's largest value (inf), so where it came from cannot be confirmed: your sum is close to the limit (float16's largest value is 65504; past 4/5 of it is not safe). Use a smaller loss scale."),
    "fail.evidence_dropped": ("进程 {rank}：{quantity} 的数值是对的，但评分器没能保留 {ops} 传来的数据来确认它的来源：它前后的预热或计时循环用大小相近的张量反复通信，用完了评分器保存证据的预算。请减少循环的次数，或用大得多的张量（1 MB 以上）计时。",
                              "Rank {rank}: {quantity} has the right numbers, but the grader could not keep what {ops} delivered to confirm where they came from: a warm-up or timing loop around it, with tensors of about the answer's size, used up the grader's budget for evidence. Repeat the loop fewer times, or time much larger tensors (1 MB or more)."),
    "fail.unobserved": ("进程 {rank}：无法确认 {quantity} 来自 {ops} 传来的数据。请返回它，或保存在同名变量中。",
                        "Rank {rank}: the grader could not confirm that {quantity} came from what {ops} delivered. Return it, or keep it in a variable of that name."),
    "fail.async_no_wait": ("进程 {rank}：{op} 用 async_op=True 发起后没有调用 wait()，读到的 {quantity} 不可靠（这次碰巧是对的也不算）。请先 work.wait() 再使用结果。",
                           "Rank {rank}: {op} was started with async_op=True and never waited on, so reading {quantity} is a race (right by luck does not count). Call work.wait() before using the result."),
    "fail.forbidden_op": ("进程 {rank} 调用了本练习不允许的 {op}（第 {line} 行）。", "Rank {rank} called {op} (line {line}), which this exercise does not allow."),
    "fail.op_not_used": ("没有用到 {op}（没有一次完成）。", "{op} was never used (none completed)."),
    "cause.op_not_used": ("原因：没有用到 {op}（没有一次完成）。", "Cause: {op} was never used (none completed)."),
    "cause.result_unused": ("原因：{quantity} 没有用到 {ops} 传来的数据：评分器秘密地改变了通信中的数据，{quantity} 却完全没有变化。"
                            "这些通信运行了，但它们的结果没有被用来计算 {quantity}。",
                            "Cause: {quantity} does not use what {ops} delivered: the grader secretly changed the data in flight and "
                            "{quantity} did not change at all. The operations ran, but their results were not used to compute it."),
    # --- the real-backend run (plan.py): the student's code on torch's own gloo / NCCL
    "fail.real_backend": ("通过评分器的交换机时这一项是对的，但同样的代码在真实的 {backend} 后端上没有通过（见下）：这个进程数下的分数不计。",
                          "Through the grader's switch this check passes, but the same code does not on real {backend} (below): "
                          "the points of this world size are not given."),
    "real.differs": ("  在真实的 {backend} 上，{quantity} 的结果与通过交换机证明的结果不同：",
                     "  On real {backend}, {quantity} is not what the switch run proved it to be:"),
    # --- what is wrong with a value
    "detail.not_tensor": ("进程 {rank}：{quantity} 不是 torch.Tensor。", "Rank {rank}: {quantity} is not a torch.Tensor."),
    "detail.subclass": ("进程 {rank}：{quantity} 是 torch.Tensor 的子类，请返回普通的 torch.Tensor。",
                        "Rank {rank}: {quantity} is a subclass of torch.Tensor; return a plain torch.Tensor."),
    "detail.dtype": ("进程 {rank}：{quantity} 的 dtype 不是浮点类型。", "Rank {rank}: {quantity} does not have a floating dtype."),
    "detail.shape": ("进程 {rank}：{quantity} 的形状不对。", "Rank {rank}: {quantity} has the wrong shape."),
    "detail.values": ("进程 {rank}：{quantity} 的数值不对。", "Rank {rank}: {quantity} has wrong values."),
    "detail.unreadable": ("进程 {rank}：{quantity} 的数值无法读取。", "Rank {rank}: the values of {quantity} cannot be read."),
    "detail.last_collective": ("  进程 {rank} 最后进入的通信操作：第 {n} 个，{op}（第 {line} 行）。", "  Rank {rank} had last entered its operation #{n}, {op} (line {line})."),
    "detail.no_collective": ("  进程 {rank} 此前没有进入任何通信操作。", "  Rank {rank} had not entered any communication."),
    "detail.rank_value": ("  进程 {rank} 的 {quantity}：期望形状 {expected_shape}、数值 {expected}；实际形状 {shape}、dtype {dtype}、数值 {values}",
                          "  rank {rank} {quantity}: expected shape {expected_shape}, values {expected}; got shape {shape}, dtype {dtype}, values {values}"),
    "detail.rank_value_other": ("  进程 {rank} 的 {quantity}：期望形状为 {expected_shape} 的 torch.Tensor、数值 {expected}；实际得到的是 {type}",
                                "  rank {rank} {quantity}: expected a torch.Tensor of shape {expected_shape}, values {expected}; got a {type}"),
    # --- causes (value-free ones may show in hidden checks: see render.hidden_safe)
    "cause.not_finite": ("原因：{op} 送来的结果里已经有 inf 或 nan：求和超出了数据类型能表示的最大值（float16 最大约 65504）。请把数据（例如损失缩放系数）调小，或用范围更大的类型通信。",
                         "Cause: what {op} delivered already held inf or nan: the sum went past its dtype's largest value (float16's is 65504). Scale the data down (a loss scale, say), or communicate in a wider dtype."),
    "cause.summed_not_averaged": ("原因：{quantity} 是平均值的 world_size 倍——求和（SUM）之后还要除以 world_size。",
                                  "Cause: {quantity} is world_size times the mean: after the sum (SUM), divide by world_size."),
    "cause.averaged_twice": ("原因：ReduceOp.AVG 已经除以了 world_size，之后又除了一次，{quantity} 只有平均值的 1/world_size。",
                             "Cause: ReduceOp.AVG already divides by world_size; dividing again leaves {quantity} at 1/world_size of the mean."),
    "cause.divided_twice": ("原因：{quantity} 被除了两次 world_size（例如通信前后各除一次）。",
                            "Cause: {quantity} was divided by world_size twice (before and after the communication, say)."),
    "cause.floor_division": ("原因：用了整除 //，{quantity} 的小数部分被截掉了；请用 /。",
                             "Cause: floor division // cut off the fraction of {quantity}; use /."),
    "cause.reduce_op": ("原因：{op}（第 {line} 行）用的是 ReduceOp.{reduce}；这里需要 SUM（再除以 world_size）或 AVG。",
                        "Cause: {op} (line {line}) used ReduceOp.{reduce}; this needs SUM (then divide by world_size) or AVG."),
    "cause.unchanged": ("原因：{quantity} 和本进程自己的数据一样，说明 {op} 的结果没有被使用（例如对副本 t.clone() 调用了 {op}；t = dist.{op}(t) 会得到 None；async_op=True 时要先 wait()）。",
                        "Cause: {quantity} equals this rank's own data, so the result of {op} was not used ({op} on a copy, t.clone() say; t = dist.{op}(t) gives None; async_op=True needs wait())."),
    "cause.own_data_divided": ('原因：{quantity} 是本进程自己的数据除以 world_size，{op} 的求和结果没有进入它（例如 {op} 作用在了一个之后被丢掉的副本 t.clone() 上，或者它的结果又被覆盖了）。请对要保留的那个张量调用 {op}，再除以 world_size。',
                              "Cause: {quantity} is this rank's own data divided by world_size: the sum {op} delivered never reached it ({op} ran on a copy that was then dropped, t.clone() say, or its result was overwritten). Call {op} on the tensor you keep, then divide by world_size."),
    "cause.unchanged_p2p": ("原因：{quantity} 仍然是本进程自己的数据：收到的数据没有进入它。交换是在副本上进行的（t.clone()、torch.cat(...)、新建的张量），"
                            "或者收到的数据没有写回传进来的那个张量：请原地修改这个张量，或者最后把结果拷回去（tensor.copy_(result)）。",
                            "Cause: {quantity} is still this rank's own data: nothing it received reached it. The exchange ran on a copy "
                            "(t.clone(), torch.cat(...), a new tensor), or what arrived was never written into the tensor the function was "
                            "given: work on that tensor in place, or copy the result back (tensor.copy_(result))."),
    "cause.op_missing": ("原因：{quantity} 应当通过 {ops} 得到，但 {ops} 一次也没有运行（这个 TODO 还没有完成？）。",
                         "Cause: {quantity} must come through {ops}, but {ops} never ran (is that TODO still open?)."),
    "cause.concat_order": ("原因：{quantity} 里每个进程的分段都在，但顺序不对：输出列表中位置 k 上是进程 k 的数据，请按列表原来的顺序（进程编号顺序）拼接。",
                           "Cause: every rank's slice is in {quantity}, but in the wrong order: slot k of the output holds rank k's data, so "
                           "concatenate the list in its own order (rank order)."),
    "cause.shared_buffers_some": ("原因：输出列表里有几个缓冲区共享同一块内存（例如同一个张量被放进了列表的好几个位置），这些位置最后都是写入它们的最后一个进程的数据。请为每个进程创建独立的张量。",
                                  "Cause: some buffers of the output list share memory (the same tensor placed in several slots "
                                  "of the list), so those slots all end with the data of the last rank written there. "
                                  "Make one tensor per rank."),
    "cause.interleaved": ('原因：{quantity} 里各进程的数据逐个元素交错排列，就像输出缓冲区是同一个二维张量（分段长度 × world_size）的列、或者分段沿最后一维堆叠后再按行展平时那样。请让每个进程的缓冲区是一行（world_size × 分段长度 的张量的行，或者各自独立的张量），再用 torch.cat 拼接。',
                         "Cause: the ranks' data in {quantity} is interleaved element by element, as when the output buffers are the columns of one (slice length, world_size) tensor, or the slices are stacked along the last dimension, and that is flattened row by row. Make each rank's buffer a row (of a (world_size, slice length) tensor, or a tensor of its own), then torch.cat them."),
    "cause.concat_divided": ("原因：{quantity} 被除以了 world_size：all_gather 只是把各进程的分段拼起来，并不求和，不需要求平均。",
                             "Cause: {quantity} was divided by world_size: all_gather collects the slices without adding them, so there is "
                             "nothing to average."),
    "cause.own_slice_again": ("原因：{quantity} 比应有的长度多出一段：本进程自己的分段又被加了一次。all_gather 的输出已经包含每个进程的分段（包括自己的），只拼接输出列表即可。",
                              "Cause: {quantity} is one slice too long: this rank's own slice was added once more. The output of all_gather "
                              "already holds every rank's slice, its own included: concatenate the output list alone."),
    "cause.hardcoded_ws": ("原因：{quantity} 正好是进程数为 {k} 时的结果，而代码里写着常数 {k}——不要把 world_size 写死，请使用参数 world_size。",
                           "Cause: {quantity} is what {k} ranks would give, and your code has the constant {k}: do not hard-code the world size, use the world_size argument."),
    "cause.integer_dtype": ("原因：{quantity} 是整数张量（{dtype}，例如 torch.full((n,), rank + 1) 的 dtype 是 int64），原地除法会失败或截断。请用浮点数，例如 float(rank + 1) 或 dtype=torch.float32。",
                            "Cause: {quantity} is an integer tensor ({dtype}; torch.full((n,), rank + 1) is int64), so in-place division fails or truncates. Use floats: float(rank + 1) or dtype=torch.float32."),
    "cause.stacked_output": ("原因：{op} 的输出用的是堆叠形式（world_size 行的二维张量）：NCCL 接受这种形式，gloo 不接受。请传入展平的输出（例如 out.flatten()），元素个数是 world_size 乘以输入的元素个数。",
                             "Cause: the output of {op} is in the stacked form (a two-dimensional tensor of world_size rows): NCCL takes it, gloo does not. Pass a flat output (out.flatten(), say) of world_size times the input's elements."),
    "cause.stack_not_cat": ("原因：用了 torch.stack，得到二维张量；应使用 torch.cat(..., dim=0) 拼成一维向量。",
                            "Cause: torch.stack gives a 2-D tensor; use torch.cat(..., dim=0) to build one vector."),
    "cause.gather_list_size": ("原因：{op} 的输出列表长度必须等于 world_size（每个进程一个缓冲区）。",
                               "Cause: the output list of {op} must hold exactly world_size buffers, one per rank."),
    "cause.shared_buffers": ("原因：输出列表里的缓冲区共享同一块内存（例如 [buf] * world_size），每个位置最后都是最后一个进程的数据。请为每个进程创建独立的张量。",
                             "Cause: the output buffers share memory (e.g. [buf] * world_size), so every slot ends with the last rank's data. Make one tensor per rank."),
    "cause.swapped": ("原因：{quantity} 里放的是 {other} 的数值——返回值的顺序弄反了？",
                      "Cause: {quantity} holds the values of {other}: is the order of the returned values swapped?"),
    "cause.read_before_wait": ("原因：{op} 用 async_op=True 发起后，在 wait() 之前就读取了结果（例如先 torch.cat 再 wait），读到的还是缓冲区原来的数据。",
                               "Cause: the result of {op} (async_op=True) was read before wait() (torch.cat before wait, say), so it still held the buffers' old contents."),
    "cause.all_blocked_in_send": ("原因：每个进程都卡在 send 里。gloo 不缓存发送：send 要等对方调用 recv 才会完成，如果所有进程都先 send 再 recv，就会互相等待。请先发起接收（irecv），或按进程编号的奇偶交替收发顺序。",
                                  "Cause: every rank is blocked in send. gloo does not buffer sends: a send completes only once the peer posts its receive, so if every rank sends before it receives, they all wait. Post the receive first (irecv), or alternate the order by rank parity."),
    "cause.async_no_wait": ("原因：{op} 用 async_op=True 发起后从没有调用 wait()，结果可能还没到。",
                            "Cause: {op} was started with async_op=True and never waited on, so its result may not have arrived."),
    "cause.object_collective": ("原因：{op} 传送的是 pickle 序列化后的对象字节，不是张量本身：评分器无法确认数值来自通信。请直接对张量使用对应的集合通信。",
                                "Cause: {op} sends pickled bytes of an object, not the tensor itself, so the grader cannot confirm the numbers came through the communication. Use the collective on the tensor directly."),
    "cause.other_op": ("原因：{quantity} 应当通过 {ops} 得到，但代码用的是 {used}（第 {line} 行）。",
                       "Cause: {quantity} must come through {ops}, but your code used {used} (line {line})."),
    "cause.group_name": ("原因：进程 {rank} 的 {op}（第 {line} 行）用的进程组与另一个进程组同名：一个由进程 {other} 组成，一个由进程 {ranks} 组成。"
                         "torch 按创建的先后给进程组编号，所以每个进程都必须按同样的顺序为每个进程组调用 new_group（不在组里的进程也要调用），"
                         "否则不同的组会得到同一个名字，gloo 会把它们的进程连错或一直等待；只让组内进程调用时，请传 use_local_synchronization=True。",
                         "Cause: rank {rank}'s {op} (line {line}) is on a group that has another group's name: one of ranks {other}, one of ranks {ranks}. "
                         "torch numbers groups in the order they are made, so every rank must call new_group for every group, in the same "
                         "order (ranks outside the group too); otherwise two groups get one name and gloo pairs their ranks wrongly or "
                         "hangs. Where only the group's ranks call it, pass use_local_synchronization=True."),
    "cause.group_name_generic": ("原因：两个不同的进程组得到了同一个名字：每个进程都必须按同样的顺序为每个进程组调用 new_group（不在组里的进程也要调用），"
                                 "或者传 use_local_synchronization=True。",
                                 "Cause: two different groups got one name: every rank must call new_group for every group, in the same "
                                 "order (ranks outside the group too), or pass use_local_synchronization=True."),
    "cause.other_op_generic": ("原因：{quantity} 应当通过 {ops} 得到，但代码用的是 {used}。",
                               "Cause: {quantity} must come through {ops}, but your code used {used}."),
    "cause.rooted_op": ("原因：{op} 只把结果留在一个进程（root）上；要让每个进程都拿到结果，请用对应的 all_* 操作。",
                        "Cause: {op} leaves the result on one rank (the root) only; use the matching all_* operation so that every rank gets it."),
    "cause.contribution": ("原因：进程 {rank} 在 {op}（第 {line} 行）中发送的是 {sent}，但它自己的数据是 {own}。每个进程都必须贡献自己的数据。",
                           "Cause: rank {rank} sent {sent} in {op} (line {line}), but its own data is {own}. Every rank must contribute its own data."),
    "cause.contribution_hidden": ("原因：有进程在通信中发送的不是它自己的数据。", "Cause: a rank did not send its own data."),
    "cause.mismatch": ("原因：各进程调用的集合通信不一致（每个进程必须按相同顺序、用相同大小调用同样的集合通信；gloo 可能把不同的调用错配在一起，得到错误结果、卡住或崩溃）。各进程依次调用了：{calls}",
                       "Cause: the ranks did not call the same collectives (every rank must make the same calls, in the same order, with the same sizes; gloo may pair mismatched calls and return garbage, hang or abort). In order, {calls}"),
    "cause.mismatch_generic": ("原因：各进程调用的集合通信不一致（例如只有部分进程调用了某个集合通信）。每个进程必须按相同顺序调用同样的集合通信。",
                               "Cause: the ranks did not call the same collectives (e.g. a collective that only some ranks call). Every rank must make the same calls in the same order."),
    "cause.assigned_none": ("原因：dist.{op} 是原地操作，返回 None（只有 async_op=True 时返回一个 work 对象）；t = dist.{op}(...) 会把变量变成 None。直接调用 dist.{op}(...)，然后使用原来的张量。",
                            "Cause: dist.{op} works in place and returns None (a work handle only with async_op=True), so t = dist.{op}(...) leaves None in t. Call dist.{op}(...) on its own and keep using the tensors you passed."),
    "cause.all_blocked_in_recv": ("原因：每个进程都卡在 recv 里，而没有任何进程发出过 send：每个进程都先 recv 再 send，于是谁也等不到数据。请让一部分进程先发送（例如按进程编号的奇偶交替收发顺序），或者先用 isend 发出、再 recv。",
                                  "Cause: every rank waits in recv and no rank has sent anything: each receives before it sends, so none ever gets its data. Let some ranks send first (alternate the order by rank parity, say), or post the send with isend before the recv."),
    "cause.p2p_unmatched": ("原因：进程 {rank} 在等待来自进程 {peer} 的数据，但进程 {peer} 从不发给它（它发给了进程 {to}）。检查 send/recv 的对象：发给谁，就要由谁来接收。",
                            "Cause: rank {rank} waits to receive from rank {peer}, which never sends to it (it sends to rank {to}). Check the peers of send and recv: every send needs a receive posted by the rank it goes to."),
    "cause.p2p_tag": ("原因：进程 {rank} 的 recv（第 {line} 行）在等待来自进程 {peer}、tag 为 {tag} 的数据，而进程 {peer} 发给它的 send 用的 tag 是 {sent_tag}：send 只和 tag 相同的 recv 配对。",
                      "Cause: rank {rank}'s recv (line {line}) waits for tag {tag} from rank {peer}, whose send to it has tag {sent_tag}: a send pairs only with a receive of the same tag."),
    "cause.p2p_tag_generic": ("原因：有进程的 recv 和对方发给它的 send 用了不同的 tag：send 只和 tag 相同的 recv 配对。",
                              "Cause: a rank's recv and the send its peer made to it carry different tags: a send pairs only with a receive of the same tag."),
    "cause.p2p_unmatched_generic": ("原因：有进程在等待一个从不给它发送数据的进程。检查 send/recv 的对象：发给谁，就要由谁来接收。",
                                    "Cause: a rank waits to receive from a rank that never sends to it. Check the peers of send and recv: every send needs a receive posted by the rank it goes to."),
    "cause.p2p_too_long": ("原因：进程 {peer} 发给进程 {rank} 的消息有 {sent} 个元素，但接收缓冲区只有 {room} 个（在 gloo 上，接收方进程会被直接终止，SIGABRT）。接收缓冲区的大小必须和发送的张量一样（块大小不等时尤其要注意）。",
                           "Cause: rank {peer} sent rank {rank} a message of {sent} elements into a receive buffer of {room} (on gloo the receiving process is aborted, SIGABRT). The receive buffer must be exactly as large as what is sent (mind uneven chunks)."),
    "cause.p2p_too_short": ("原因：进程 {peer} 发给进程 {rank} 的消息只有 {sent} 个元素，但接收缓冲区有 {room} 个（在 gloo 上，缓冲区的其余部分保持原样，悄悄地出错）。接收缓冲区的大小必须和发送的张量一样（块大小不等时尤其要注意）。",
                            "Cause: rank {peer} sent rank {rank} a message of {sent} elements into a receive buffer of {room} (on gloo the rest of the buffer keeps what it held: silently wrong). The receive buffer must be exactly as large as what is sent (mind uneven chunks)."),
    "cause.p2p_too_short_generic": ("原因：有进程收到的消息比接收缓冲区短：接收缓冲区的大小必须和发送的张量一样（块大小不等时尤其要注意）。",
                                    "Cause: a message was shorter than its receive buffer: the receive buffer must be exactly as large as what is sent (mind uneven chunks)."),
    "cause.p2p_dtype": ("原因：进程 {peer} 发送的是 {sent_dtype}，而进程 {rank} 的接收缓冲区是 {room_dtype}（在 gloo 上，这些字节会被按错误的类型解读）。接收缓冲区的类型必须和发送的张量一样。",
                        "Cause: rank {peer} sent {sent_dtype} into rank {rank}'s receive buffer of {room_dtype} (on gloo the bytes would be read as the wrong type). The receive buffer must have the dtype of what is sent."),
    "cause.p2p_dtype_generic": ("原因：有进程的接收缓冲区类型和发送的张量不同：接收缓冲区的类型必须和发送的张量一样。",
                                "Cause: a receive buffer's dtype was not the dtype of what was sent: they must match."),
    "cause.p2p_too_long_generic": ("原因：有进程收到的消息比接收缓冲区长（在 gloo 上，接收方进程会被直接终止，SIGABRT）。接收缓冲区的大小必须和发送的张量一样（块大小不等时尤其要注意）。",
                                   "Cause: a message was longer than its receive buffer: gloo aborts the receiving process (SIGABRT). The receive buffer must be exactly as large as what is sent (mind uneven chunks)."),
    # --- traffic (verify/traffic.py): the measured exchanges against the pattern the exercise declares
    "cause.traffic_needs_value": ("原因：通信量只在结果正确时计分：这个进程数下 {quantity} 没有通过数值检查。",
                                  "Cause: traffic counts only for a correct answer: {quantity} does not pass its values check at this world size."),
    "cause.traffic_none": ("原因：进程 {rank} 没有任何点对点通信（send/recv）。", "Cause: rank {rank} made no point-to-point exchange (send/recv) at all."),
    "cause.traffic_none_generic": ("原因：有进程没有任何点对点通信（send/recv）。", "Cause: a rank made no point-to-point exchange (send/recv) at all."),
    "cause.traffic_gather": ("原因：进程 {rank} 从 {m} 个进程收到了 {k} × S 的数据：这是把数据汇集到一个进程（gather），不是环。",
                             "Cause: rank {rank} received {k} x S from {m} ranks: a gather to one rank, not a ring."),
    "cause.traffic_gather_generic": ("原因：有一个进程收到了其他所有进程的数据：这是把数据汇集到一个进程（gather），不是环。",
                                     "Cause: one rank received the data of every other rank: a gather to one rank, not a ring."),
    "cause.traffic_peers": ("原因：进程 {rank} 发给进程 {to}、从进程 {frm} 接收；环中每个进程只发给一个邻居、只从另一个邻居接收。",
                            "Cause: rank {rank} sends to ranks {to} and receives from ranks {frm}; in a ring each rank sends to one neighbour only and receives from the other only."),
    "cause.traffic_peers_generic": ("原因：有进程发给或接收自不止一个进程；环中每个进程只发给一个邻居、只从另一个邻居接收。",
                                    "Cause: a rank sends to, or receives from, more than one rank; in a ring each rank sends to one neighbour only and receives from the other only."),
    "cause.traffic_not_neighbour": ("原因：进程 {rank} 发给进程 {to}，它不是邻居（(rank ± 1) % N）。",
                                    "Cause: rank {rank} sends to rank {to}, which is not its neighbour ((rank ± 1) % N)."),
    "cause.traffic_not_neighbour_generic": ("原因：有进程把数据发给了不是邻居（(rank ± 1) % N）的进程。",
                                            "Cause: a rank sends to a rank that is not its neighbour ((rank ± 1) % N)."),
    "cause.traffic_direction": ("原因：进程 {rank} 发给进程 {to}，而进程 {other} 发给进程 {other_to}：环的方向必须在所有进程上一致。",
                                "Cause: rank {rank} sends to rank {to} but rank {other} sends to rank {other_to}: the ring must turn the same way on every rank."),
    "cause.traffic_direction_generic": ("原因：各进程发送的方向不一致：环的方向必须在所有进程上一致。",
                                        "Cause: the ranks do not send the same way round: the ring must turn the same way on every rank."),
    "cause.traffic_same_side": ("原因：进程 {rank} 发给进程 {to}，却从进程 {frm} 接收：应当从另一侧的邻居接收。",
                                "Cause: rank {rank} sends to rank {to} but receives from rank {frm}: receive from the neighbour on the other side."),
    "cause.traffic_same_side_generic": ("原因：有进程从它发送的同一侧接收：应当从另一侧的邻居接收。",
                                        "Cause: a rank receives from the side it sends to: receive from the neighbour on the other side."),
    "cause.traffic_sends": ("原因：进程 {rank} 发送了 {count} 次；这里每个进程应发送 {formula} = {expected} 次。",
                            "Cause: rank {rank} sent {count} times; each rank should send {formula} = {expected} times."),
    "cause.traffic_sends_generic": ("原因：每个进程的发送次数不是 {formula}。", "Cause: the number of sends per rank is not {formula}."),
    "cause.traffic_bytes": ("原因：进程 {rank} 发送了 {sent} 个元素 = {k} × S（S = {size} 个元素），超过环形上限 {formula} = {bound_k} × S（{bound} 个元素，含不等分块的取整）。",
                            "Cause: rank {rank} sent {sent} elements = {k} x S (S = {size} elements), over the ring bound {formula} = {bound_k} x S ({bound} elements, rounding of uneven chunks included)."),
    "cause.traffic_chunk": ("原因：进程 {rank} 有一次发送了 {largest} 个元素，超过了一块：把张量切成 N 块、每块 S // N 个元素、余数归入其中一块（例如最后一块）时，"
                            "最大的一块也只有 S - (N-1) × floor(S/N) = {chunk} 个元素（tensor_split 的块最多 ceil(S/N) 个）：环形算法每一步只发送一块。",
                            "Cause: rank {rank} sent {largest} elements in one send, more than one chunk: cut into N chunks of S // N elements with one of "
                            "them (the last, say) taking the remainder, the largest holds S - (N-1) x floor(S/N) = {chunk} elements (tensor_split's at most "
                            "ceil(S/N)); each step of a ring sends one chunk."),
    "cause.traffic_chunk_generic": ("原因：有一次发送超过了一块：把张量切成 N 块、每块 S // N 个元素、余数归入其中一块时，最大的一块也只有 "
                                    "S - (N-1) × floor(S/N) 个元素（tensor_split 的块最多 ceil(S/N) 个）：环形算法每一步只发送一块。",
                                    "Cause: a send was larger than one chunk: cut into N chunks of S // N elements with one of them taking the remainder, "
                                    "the largest holds S - (N-1) x floor(S/N) elements (tensor_split's at most ceil(S/N)); each step of a ring sends one chunk."),
    "cause.traffic_dtype": ("原因：进程 {rank} 发送的是 {sent}，而它返回的张量是 {dtype}：通信量按元素计算，换成更窄的类型并不节省，而且会丢精度。请发送张量本身的类型。",
                            "Cause: rank {rank} sent {sent} where the tensor it returned is {dtype}: traffic is counted in elements, so a narrower type saves nothing, and it loses precision. Send the tensor's own dtype."),
    "cause.traffic_dtype_generic": ("原因：有进程发送时换成了别的数据类型：通信量按元素计算，换成更窄的类型并不节省。请发送张量本身的类型。",
                                    "Cause: a rank sent another dtype than its tensor's: traffic is counted in elements, so a narrower type saves nothing. Send the tensor's own dtype."),
    "cause.traffic_bytes_generic": ("原因：有进程发送的数据超过环形上限 {formula}（含不等分块的取整）。",
                                    "Cause: a rank sent more than the ring bound {formula} (rounding of uneven chunks included)."),
    "cause.traffic_whole": ("原因：进程 {rank} 的 {count} 次发送每次都发了整个张量（共 {sent} 个元素 = {k} × S）：每一步只应发送一块（约 S/N），上限 {formula} = {bound_k} × S。",
                            "Cause: rank {rank} sent the whole tensor at each of its {count} sends ({sent} elements = {k} x S): each step sends one chunk (about S/N), bound {formula} = {bound_k} x S."),
    "cause.traffic_whole_generic": ("原因：每一步都发送了整个张量：每一步只应发送一块（约 S/N），上限 {formula}。",
                                    "Cause: the whole tensor was sent at every step: each step sends one chunk (about S/N), bound {formula}."),
    "detail.traffic": ("  进程 {rank}：发送 {sends} 次共 {sent} 个元素（{sent_bytes} 字节，给进程 {to}），接收 {recvs} 次共 {received} 个元素（{received_bytes} 字节，来自进程 {frm}）",
                       "  rank {rank}: {sends} sends, {sent} elements ({sent_bytes} bytes, to rank {to}); {recvs} receives, {received} elements ({received_bytes} bytes, from rank {frm})"),
    "pass.ring": ("通过：每个进程只发给邻居 (rank {d}) % N、只从另一侧的邻居接收，方向一致。",
                  "Passed: every rank sends only to its neighbour (rank {d}) % N and receives only from the other side, the same way round on every rank."),
    "pass.traffic": ("通过：每个进程发送 {formula} = {count} 次，每次不超过一块（{chunk} 个元素），共最多 {sent} 个元素，不超过上限 {vformula}（S = {size} 个元素，上限 {bound} 个元素）。",
                     "Passed: every rank made {formula} = {count} sends of at most one chunk ({chunk} elements), at most {sent} elements in all, within {vformula} (S = {size} elements, bound {bound} elements)."),
    "teach.traffic_bound": ("  环形上限（{ws} 个进程，S = {size} 个元素）：每个进程发送 {sformula} = {count} 次，每次最多一块（{chunk} 个元素），共最多 {bound} 个元素（{formula}，含不等分块的取整）",
                            "  ring bound ({ws} ranks, S = {size} elements): each rank makes {sformula} = {count} sends of at most one chunk ({chunk} elements), at most {bound} elements in all ({formula}, rounding of uneven chunks included)"),
    # --- counts, volume, groups (verify/kinds.py): what the switch measured of the collectives
    "cause.kind_needs_value": ("原因：这一项只在结果正确时计分：这个进程数下 {quantity} 没有通过数值检查。",
                               "Cause: this counts only for a correct answer: {quantity} does not pass its values check at this world size."),
    "cause.counts_more": ("原因：进程 {rank} 完成了 {count} 次 {op}，这里应当是 {expected} 次：通信次数决定了通信开销（例如梯度累积时，K 个 micro-batch 只需要一次 all_reduce）。",
                          "Cause: rank {rank} completed {op} {count} times; wanted: {expected}. The number of communications is their cost (accumulating K micro-batches needs one all_reduce, say)."),
    "cause.counts_more_generic": ("原因：有进程的 {op} 次数比要求的多：通信次数决定了通信开销。",
                                  "Cause: a rank ran {op} more times than wanted: the number of communications is their cost."),
    "cause.counts_fewer": ("原因：进程 {rank} 只完成了 {count} 次 {op}，这里应当是 {expected} 次。",
                           "Cause: rank {rank} completed {op} {count} times; wanted: {expected}."),
    "cause.counts_fewer_generic": ("原因：有进程的 {op} 次数比要求的少。", "Cause: a rank ran {op} fewer times than wanted."),
    "cause.counts_all": ("原因：各进程一共完成了 {count} 次 {op}，这里应当是 {expected} 次。",
                         "Cause: the ranks completed {op} {count} times in all; wanted: {expected}."),
    "cause.counts_all_generic": ("原因：各进程 {op} 的总次数不对。", "Cause: the ranks' number of {op} in all is not the one wanted."),
    "pass.counts": ("通过：每个进程完成的 {op} 次数符合要求（{count}）。", "Passed: every rank completed {op} as many times as wanted ({count})."),
    "detail.counts": ("  进程 {rank}：{op} 完成了 {count} 次", "  rank {rank}: {op} completed {count} times"),
    "cause.volume_dtype": ("原因：进程 {rank} 的 {op}（第 {line} 行）传送的是 {dtype}（每个元素 {size} 字节）：这里要求 {allowed}（每个元素 {want} 字节），通信量才能减半。",
                           "Cause: rank {rank}'s {op} (line {line}) carried {dtype} ({size} bytes an element): this asks for {allowed} ({want} bytes an element), which halves the traffic."),
    "cause.volume_dtype_generic": ("原因：{op} 传送的数据类型不是要求的类型：换成更窄的类型，通信量才会减少。",
                                   "Cause: {op} did not carry the dtype asked for: only a narrower type cuts the traffic."),
    "cause.volume_bytes": ("原因：进程 {rank} 在 {count} 次 {op} 中共发送了 {sent} 字节，超过上限 {bound} 字节。",
                           "Cause: rank {rank} sent {sent} bytes in {count} {op}, over the bound of {bound} bytes."),
    "cause.volume_bytes_generic": ("原因：{op} 发送的字节数超过了上限。", "Cause: {op} sent more bytes than the bound."),
    "pass.volume": ("通过：{op} 传送的是 {allowed}，每个进程最多发送 {sent} 字节，不超过上限 {bound} 字节。",
                    "Passed: {op} carried {allowed}, at most {sent} bytes per rank, within the bound of {bound} bytes."),
    "detail.volume": ("  进程 {rank}：{count} 次 {op}，共 {sent} 字节（{dtypes}）", "  rank {rank}: {count} {op}, {sent} bytes ({dtypes})"),
    "cause.groups_inside": ("原因：进程 {rank} 的 {op}（第 {line} 行）的进程组 {ranks} 跨越了节点 {nodes}：这一步应当只在本节点内进行。",
                            "Cause: rank {rank}'s {op} (line {line}) runs on the group {ranks}, which spans nodes {nodes}: this step stays inside one node."),
    "cause.groups_inside_generic": ("原因：本应只在节点内进行的 {op} 跨越了节点。", "Cause: {op}, which stays inside one node, crossed nodes."),
    "cause.groups_flat": ("原因：进程 {rank} 的 {op}（第 {line} 行）在进程组 {ranks} 上跨越节点，其中一个节点有 {k} 个进程参加（每个节点 {node} 个进程）：分层通信中，跨节点的那一步每个节点只派一个进程（leader）。",
                          "Cause: rank {rank}'s {op} (line {line}) on the group {ranks} crosses nodes with {k} ranks of one node (nodes of {node} ranks): in hierarchical communication, only one rank per node (its leader) takes part across nodes."),
    "cause.groups_flat_generic": ("原因：跨节点的 {op} 中，同一个节点有不止一个进程参加：分层通信中，跨节点的那一步每个节点只派一个进程（leader）。",
                                  "Cause: {op} crossed nodes with more than one rank of a node: in hierarchical communication only one rank per node (its leader) takes part across nodes."),
    "cause.groups_flat_p2p": ("原因：进程 {ranks} 属于同一个节点（每个节点 {node} 个进程），却都向别的节点发送数据（例如进程 {rank} 的 {op}，第 {line} 行）：分层通信中，跨节点的那一步每个节点只派一个进程（leader）。",
                              "Cause: ranks {ranks} (one node; nodes of {node} ranks) each send to another node (rank {rank}'s {op}, line {line}, for one): in hierarchical communication, only one rank per node (its leader) takes part across nodes."),
    "cause.groups_flat_p2p_generic": ("原因：同一个节点有不止一个进程向别的节点发送数据：分层通信中，跨节点的那一步每个节点只派一个进程（leader）。",
                                      "Cause: more than one rank of a node sent to another node: in hierarchical communication only one rank per node (its leader) takes part across nodes."),
    "cause.groups_linked": ("原因：跨节点的 {op} 等操作经由别的节点的进程，把同一个节点的两个进程连到了一起（它们都与别的节点的同一批进程交换数据）：进程组切得再小，这也是扁平的通信。分层通信中，跨节点的那一步每个节点只派一个进程（leader）；张量分成几份时，可以由几组进程分别跨节点传送，但每组里每个节点只有一个进程，各组之间互不相连。",
                            "Cause: operations across nodes ({op} among them) link two ranks of the same node through ranks of other nodes (both exchange data across nodes with the same ranks): flat communication, however small its groups. In hierarchical communication only one rank per node (its leader) takes part across nodes; a tensor split in parts may cross in several sets of ranks, each with one rank per node, the sets kept apart."),
    "detail.groups_linked": ("  进程 {a} 和 {b} 属于同一个节点（节点 {node}），跨节点的通信把它们连在了一起：",
                             "  ranks {a} and {b} belong to one node (node {node}), and what crosses nodes links them:"),
    "detail.groups_link": ("    进程 {rank} 的 {op}（第 {line} 行），进程组 {ranks}：与进程 {peer} 交换数据",
                           "    rank {rank}'s {op} (line {line}) on the group {ranks}: with rank {peer}"),
    "detail.groups_link_p2p": ("    进程 {rank} 的 {op}（第 {line} 行）：发给进程 {peer}",
                               "    rank {rank}'s {op} (line {line}): to rank {peer}"),
    "pass.groups": ("通过：{inside} 只在节点内进行（每个节点 {node} 个进程，共 {nodes} 个节点），跨节点的通信每个节点只有一个进程参加（进程 {leaders}），共 {crossed} 字节跨越了节点边界。",
                    "Passed: {inside} stay inside a node ({nodes} nodes of {node} ranks), and across nodes one rank per node takes part (ranks {leaders}): {crossed} bytes crossed the node boundary."),
    "detail.groups": ("  进程 {rank}（节点 {node}）：跨节点发送 {crossed} 字节", "  rank {rank} (node {node}): {crossed} bytes sent across nodes"),
    # --- why provenance failed (the tracer's findings)
    "why.not_delivered": ("  进程 {rank} 的 {quantity} 第 {element} 个元素（{value:g}）不是任何通信传来的数据算出来的。",
                          "  Element {element} of {quantity} on rank {rank} ({value:g}) was not derived from anything the communication delivered."),
    "why.not_delivered_value": ("  进程 {rank} 的 {quantity} 第 {element} 个元素（{value:g}）不是 {ops} 传给它的任何一个值（也不是它自己的数据）。",
                                "  Element {element} of {quantity} on rank {rank} ({value:g}) is none of the values {ops} delivered to it "
                                "(nor its own data)."),
    "why.contribution": ("  进程 {rank} 在第 {n} 个通信操作 {op}（第 {line} 行）中发送的是 {sent}，而不是它自己的数据 {own}。",
                         "  Rank {rank} sent {sent} in its operation #{n}, {op} (line {line}), instead of its own data {own}."),
    "why.contribution_derived": ("  进程 {rank} 在第 {n} 个通信操作 {op}（第 {line} 行）中发送的是 {sent}，不是它用通信传来的数据算出的结果。",
                                 "  Rank {rank} sent {sent} in its operation #{n}, {op} (line {line}), which is not what it computes from the data the communication delivered to it."),
    "why.weights": ("  进程 {rank} 的 {quantity} 第 {element} 个元素里，进程 {source} 的数据占的比例是 {weight:g}，应为 {expected:g}（缺少的进程：{missing}；重复计入的进程：{twice}）。",
                    "  In element {element} of {quantity} on rank {rank}, rank {source}'s data counts {weight:g} times where it should count {expected:g} (ranks missing: {missing}; counted twice: {twice})."),
    "why.inconsistent": ("  进程 {rank} 第 {n} 个通信操作 {op}（第 {line} 行）收到的数据与各进程发送的数据对不上（与另一个操作错配了？）。",
                         "  What rank {rank} received in its operation #{n}, {op} (line {line}), does not match what the ranks sent (paired with another operation?)."),
    "why.not_finite": ("  进程 {rank} 在 {op}（第 {line} 行）中收到的数据含有 inf 或 nan：求和超出了该数据类型能表示的最大值（float16 最大约 65504）。",
                       "  What rank {rank} received in {op} (line {line}) holds inf or nan: the sum went past its dtype's largest value (float16's is 65504)."),
    "why.nonlinear": ("  {op} 用的是 ReduceOp.{reduce}，得到的不是各进程数据之和。", "  {op} used ReduceOp.{reduce}, which does not add the ranks' data."),
    "why.unmatched": ("  进程 {rank} 收到的数据找不到对应的发送。", "  Data rank {rank} received matches no send."),
    "why.incomplete": ("  不是所有进程都参加了 {op}。", "  Not every rank took part in {op}."),
    "why.layout": ("  无法确定 {op} 的输入与输出如何对应。", "  How the inputs of {op} map to its outputs could not be told."),
    "why.unobserved": ("  进程 {rank} 在 {op} 中发送的数据太大，评分器没有记录。", "  What rank {rank} sent in {op} was too large for the grader to record."),
    "why.too_deep": ("  数据经过的转发层数太多。", "  The data went through too many hops."),
    "why.too_complex": ("  评分器无法在限定的工作量内追溯这个值的来源：数据与送达的值能以太多种方式对上。",
                        "  The grader could not trace this value within its budget: the data matches what was delivered in too many ways."),
    # --- hints for hidden checks, by outcome (no values, no code)
    "hint.wrong": ("结果不正确。", "The result is wrong."),
    "hint.wrong_counts": ("通信的次数不符合这一项的要求。", "The number of communications is not what this check asks for."),
    "hint.wrong_volume": ("通信的数据类型或字节数不符合这一项的要求。", "The dtype or the bytes on the wire are not what this check asks for."),
    "hint.wrong_groups": ("通信跨越节点边界的方式不符合这一项的要求。", "What crossed the node boundary is not what this check asks for."),
    "hint.wrong_traffic": ("点对点通信的模式或通信量不符合这一项的要求。", "The point-to-point pattern or its traffic is not what this check asks for."),
    "hint.missing": ("没有得到结果：请返回要求的数值。", "No result: return the values the exercise asks for."),
    "hint.bad_type": ("结果不是普通的 torch.Tensor。", "The result is not a plain torch.Tensor."),
    "hint.exception": ("代码在这个测试中抛出了异常。", "Your code raised an exception in this test."),
    "hint.timeout": ("运行超时：可能有进程卡在通信里，或者死循环。", "Time limit: a rank hung in a communication or looped forever."),
    "hint.deadlock": ("死锁：各进程的通信操作无法配对。", "Deadlock: the ranks' operations cannot pair up."),
    "hint.not_collective": ("无法确认结果来自通信传来的数据、由每个进程自己的数据组成。",
                            "The result could not be traced to what the communication delivered, made of every rank's own data."),
    "hint.limit": ("运行超出了资源限制（内存、CPU、输出或进程数）。", "The run went over a resource limit (memory, CPU, output or processes)."),
    "hint.crash": ("有进程崩溃或提前退出。", "A rank crashed or exited early."),
    "hint.todo": ("TODO 还没有完成。", "The TODOs are not done yet."),
    "hint.not_submitted": ("没有可以评分的代码。", "There is no code to grade."),
    "hint.grader_error": ("评分器出错，请联系助教。", "The grader failed: tell your TA."),
    "hint.forbidden": ("用了本练习不允许的操作。", "An operation this exercise does not allow was used."),
    "hint.protocol": ("有进程向评分器发送了正常代码不会发送的数据。", "A rank sent the grader what no ordinary code sends."),
    "hint.real_backend": ("在真实的通信后端上运行时，代码失败了，或者得到了不同的结果。",
                          "On the real communication backend the code failed, or gave other results."),
    # --- structured parameters
    "frame": ("第 {line} 行，{function} 中：{text}", "line {line} in {function}: {text}"),
    "frames.none": ("无", "-"),
    "where.cell_line": ("第 {cell} 个单元格第 {line} 行", "cell {cell}, line {line}"),     # a notebook's line (feedback/lines.py)
    "where.cell_lines": ("第 {cell} 个单元格第 {line} 行", "cell {cell}, lines {line}"),
    "calls.rank": ("进程 {rank}：{ops}", "rank {rank}: {ops}"),
    "list.sep": ("；", "; "),
    "list.comma": ("、", ", "),
    "list.colon": ("：", ": "),
    # --- report
    "summary.exercise": ("练习：{title}", "Exercise: {title}"),
    "summary.score": ("得分：{score:g} / {max_score:g}", "Score: {score:g} / {max_score:g}"),
    "summary.hidden_pending": ("另有 {count} 项隐藏测试，成绩公布后可见。", "{count} hidden checks: shown once grades are published."),
    "summary.hidden_points": ("另有 {points:g} 分在隐藏测试中：check 只运行可见测试，隐藏测试的结果在成绩公布后可见。",
                              "{points:g} more points are in hidden checks: check runs the visible checks only, and hidden ones show once grades are published."),
    "summary.grader_failed": ("自动评分器出错，本次成绩记为 0 分，请联系助教。", "The autograder failed; this grade is 0 until a TA looks at it."),
    "summary.layers": ("沙箱：{layers}", "Sandbox: {layers}"),
    "layer.rlimits": ("资源限制（rlimits）", "rlimits"),
    "layer.process_group": ("独立进程组", "process group"),
    "layer.uid": ("非特权用户", "unprivileged uid"),
    "layer.pid_ns": ("PID 命名空间", "pid namespace"),
    "layer.net_ns": ("网络命名空间（仅回环）", "network namespace (loopback only)"),
    "layer.private_tmp": ("私有 /tmp", "private /tmp"),
    "layer.fresh_proc": ("独立的 /proc", "fresh /proc"),
    "layer.user_ns": ("用户命名空间", "user namespace"),
    "layer.memory_cgroup": ("内存 cgroup（所有进程共 {mb} MiB）", "memory cgroup ({mb} MiB for all ranks)"),
    "summary.output": ("进程 {rank} 的输出（前 {kept} 字节，共 {total} 字节）：", "Output of rank {rank} (first {kept} of {total} bytes):"),
    "teach.header": ("通信开销（{ws} 个进程，{backend}）：", "Communication cost ({ws} ranks, {backend}):"),
    "teach.header_untimed": ("通信量（{ws} 个进程，由评分器的交换机测量；没有在真实后端上计时）：",
                             "Communication volume ({ws} ranks, measured at the grader's switch; not timed on a real backend):"),
    "teach.collective_untimed": ("  进程 {rank} {op}：数据 {size} 字节，环形算法每个进程发送约 {volume} 字节（{formula}）",
                                 "  rank {rank} {op}: {size} bytes of data, a ring sends about {volume} bytes per rank ({formula})"),
    "teach.collective_untimed_calls": ("  进程 {rank} {op}：{calls} 次，每次数据 {size} 字节，环形算法每次每个进程发送约 {volume} 字节（{formula}）",
                                       "  rank {rank} {op}: {calls} calls, each on {size} bytes of data, a ring sends about {volume} "
                                       "bytes per rank per call ({formula})"),
    # times from the real-backend run (verify/teach.py): a first call includes set-up; no bandwidth from a first
    # call or a small message
    "teach.collective_first": ("  进程 {rank} {op}：{ms:.2f} ms（第一次调用，含建立连接的开销）；数据 {size} 字节，环形算法每个进程发送约 {volume} 字节（{formula}）",
                               "  rank {rank} {op}: {ms:.2f} ms (its first call, set-up included); {size} bytes of data, a ring "
                               "sends about {volume} bytes per rank ({formula})"),
    "teach.collective_repeated": ("  进程 {rank} {op}：{calls} 次，第一次 {first_ms:.2f} ms（含建立连接的开销），其余中位数 {ms:.2f} ms；"
                                  "每次数据 {size} 字节，环形算法每次每个进程发送约 {volume} 字节（{formula}）",
                                  "  rank {rank} {op}: {calls} calls, the first {first_ms:.2f} ms (set-up included), then a median "
                                  "of {ms:.2f} ms; {size} bytes of data each, a ring sends about {volume} bytes per rank per call ({formula})"),
    "teach.collective_rate": ("  进程 {rank} {op}：{calls} 次，第一次 {first_ms:.2f} ms（含建立连接的开销），其余中位数 {ms:.2f} ms；"
                              "每次数据 {size} 字节，环形算法每次每个进程发送约 {volume} 字节（{formula}），约 {bandwidth}",
                              "  rank {rank} {op}: {calls} calls, the first {first_ms:.2f} ms (set-up included), then a median "
                              "of {ms:.2f} ms; {size} bytes of data each, a ring sends about {volume} bytes per rank per call "
                              "({formula}), about {bandwidth}"),
    "teach.no_bandwidth": ("  没有给出带宽：第一次调用含建立连接的开销，小于 {min} 的消息主要测到的是每次调用的固定开销。"
                           "带宽由 {command} 测量（先预热，4 KiB 到 64 MiB；适用于声明了计时函数的练习，例如 ring_allreduce）。",
                           "  No bandwidth is given for a first call (it includes the set-up) or for a message under {min} (its time "
                           "is mostly the call's fixed cost). {command} measures bandwidth (warmed up, 4 KiB to "
                           "64 MiB; for exercises that declare a function to time, such as ring_allreduce)."),
    "teach.p2p": ("  进程 {rank}：发送 {sends} 次共 {sent} 字节（给进程 {to}），接收 {recvs} 次共 {received} 字节（来自进程 {frm}）",
                  "  rank {rank}: {sends} sends, {sent} bytes (to rank {to}); {recvs} receives, {received} bytes (from rank {frm})"),
    "status.passed": ("通过", "passed"),
    "status.failed": ("未通过", "failed"),
    # --- batch (for TAs)
    "batch.verdicts": ("结论统计：", "Verdicts:"),
    "batch.mean_median": ("{count} 份提交：平均分 {mean:.1f}，中位数 {median:g}（满分 {max:g}）",
                          "{count} submissions: mean {mean:.1f}, median {median:g} (out of {max:g})"),
    "batch.histogram": ("总分分布：", "Totals:"),
    "batch.done": ("本次评分 {graded} 份，沿用已有结果 {reused} 份，清理临时文件 {swept} 个，用时 {seconds:.1f} 秒。成绩表：{csv}",
                   "Graded {graded}, reused {reused} up-to-date results, swept {swept} temporary files, in {seconds:.1f} s. Gradebook: {csv}"),
    "backend.nccl_unavailable": ("NCCL 需要至少 {ws} 张可见的 GPU，当前只有 {gpus} 张：没有在真实的 NCCL 上运行（评分照常通过评分器的交换机进行）。",
                                 "NCCL needs at least {ws} visible GPUs; this machine shows {gpus}: the code was not run on real NCCL (the grading went through the grader's switch as always)."),
    # --- bench (integrations/bench.py)
    "bench.header": ("{function} 与 dist.{baseline} 的计时：普通 gloo 进程组（不经过评分器的观测层，不计观测开销）；algbw = S/t，busbw = algbw × 2(N-1)/N（nccl-tests 的定义）",
                     "{function} against dist.{baseline}, timed on a plain gloo process group (not through the grader's observed backend: no observation cost); algbw = S/t, busbw = algbw x 2(N-1)/N (the nccl-tests definitions)"),
    "bench.error": ("  出错（进程数 {error}）", "  failed (world size {error})"),
    "bench.plot": ("图已写入 {path}（用时 {seconds:.1f} 秒）", "Plot written to {path} ({seconds:.1f} s)"),
    "bench.autograde": ("（自动评分时不计时：计时不计分，只会拖慢全班的评分。）", "(Not timed while autograding: timing earns no points and would only slow the whole class's grading.)"),
    "bench.none": ("练习 {name} 没有可计时的函数（或提交无法读取）。", "Exercise {name} declares no function to time (or the submission cannot be read)."),
    # --- list
    "list.header": ("练习（括号内为总分与可见的进程数；隐藏测试的进程数不显示）：", "Exercises (total points and visible world sizes; hidden world sizes are not shown):"),
    "list.row": ("  {name}：{title}（{points:g} 分；可见进程数 {visible}）", "  {name}: {title} ({points:g} points; visible world sizes {visible})"),
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
    # --- notebooks: files the cells write (issue 19)
    "note.writefile_bad_name": ("第 {cell} 个代码单元格用 %%writefile 写入 {file}：这个文件名不是当前文件夹内的普通相对路径（不能是绝对路径、不能含 ..、不能以点开头、不能含要展开的变量），评分时没有写入这个文件。",
                                "Code cell {cell} writes {file} with %%writefile: that name is not a plain relative path inside the folder (no absolute path, no .., no leading dot, no variable to expand), so the file was not written when grading."),
    "note.writefile_too_large": ("第 {cell} 个代码单元格写入的 {file} 超过了 {limit} 字节，评分时没有写入这个文件。",
                                 "The file {file} that code cell {cell} writes is over {limit} bytes: it was not written when grading."),
    "note.writefile_too_many": ("第 {cell} 个代码单元格写入的 {file} 超出了可写文件的数量上限（{limit} 个），评分时没有写入这个文件。",
                                "Code cell {cell} writes {file}, one file more than the {limit} a notebook may write: it was not written when grading."),
    "batch.entry_failed": ("评分 {name} 时出错：{error}", "Grading {name} failed: {error}"),
    # --- class report (issue 13): integrations/classreport.py (terminal, causes.csv) and classpage.py (report.html)
    "classreport.whole": ("无法评分的提交（每项测试都不通过，每名学生只算一次）：", "Submissions that could not be graded (they fail every check; each student counts once):"),
    "classreport.every_check": ("所有测试", "every check"),
    "classreport.whole_note": ("{count} 份提交无法评分，每项测试都不通过；它们的原因在“常见原因”中只算一次。",
                               "{count} submissions could not be graded and fail every check; their causes count once each under Most common causes."),
    "classreport.checks": ("各项测试的通过率与常见原因：", "Pass rate and common causes per check:"),
    "classreport.check": ("{check}（{title}）：通过 {passed}/{count}（{rate:.0f}%）", "{check} ({title}): {passed}/{count} passed ({rate:.0f}%)"),
    "classreport.cause": ("  {key}：{count} 名学生", "  {key}: {count} students"),
    "classreport.cause_one": ("  {key}：1 名学生", "  {key}: 1 student"),
    "classreport.who": ("      学生：{names}", "      students: {names}"),
    "classreport.more": ("，另有 {count} 人（完整名单见 causes.csv）", ", and {count} more (all in causes.csv)"),
    "classreport.more_causes": ("  其余原因：{count} 种（见 report.html）", "  further causes: {count} (see report.html)"),
    "classreport.other": ("其他（没有具体原因）", "other (no named cause)"),
    "classreport.written": ("班级报告：{html}；每名学生的原因：{csv}", "Class report: {html}; causes per student: {csv}"),
    "classreport.title": ("班级报告：{title}", "Class report: {title}"),
    "classreport.histogram": ("总分分布", "Score distribution"),
    "classreport.histogram_note": ("每一栏是总分的十分之一，最后一栏是满分。", "Each bar is a tenth of the total; the last one is full marks."),
    "classreport.pass_rates": ("各项测试的通过率", "Pass rate per check"),
    "classreport.rate": ("通过 {passed}/{count}（{rate:.0f}%）", "{passed}/{count} passed ({rate:.0f}%)"),
    "classreport.hidden": ("隐藏", "hidden"),
    "classreport.top_causes": ("常见原因", "Most common causes"),
    "classreport.top_causes_note": ("一名学生在几项测试中有同一个原因，只算一次。", "A student with one cause on several checks counts once."),
    "classreport.no_causes": ("没有未通过的测试。", "No check failed."),
    "classreport.example": ("{student}，{check}", "{student}, {check}"),
    "classreport.students": ("学生", "Students"),
    "classreport.timeline": ("打开这个学生在可见进程数下那次运行的时空图", "Open the space-time diagram of this student's run at the visible world size"),
    "classreport.sort_note": ("点击表头即可按该列排序，再点一次倒序。", "Click a column's title to sort by it; click again to reverse."),
    "classreport.col_student": ("学生", "Student"),
    "classreport.col_score": ("总分", "Score"),
    "classreport.col_verdict": ("结论", "Verdict"),
    "classreport.col_causes": ("原因", "Causes"),
    "classreport.col_count": ("人数", "Students"),
    "classreport.col_cause": ("原因", "Cause"),
    "classreport.col_checks": ("测试", "Checks"),
    "classreport.col_example": ("反馈示例", "Example of the feedback"),
    "classreport.col_who": ("学生名单", "Who"),
    "classreport.traffic": ("通信量与环形算法的界", "Traffic against the ring bound"),
    "classreport.traffic_check": ("{check}（{ws} 个进程）：{within} 人在界内，{over} 人超出。",
                                  "{check} ({ws} ranks): {within} within the bound, {over} over it."),
    "classreport.traffic_note": ("柱长是单个进程发送的最多字节数与环形算法的界 2(N-1)/N × S 之比；竖线是界。",
                                 "Each bar is the most bytes one rank sent, over the ring bound 2(N-1)/N x S; the line is the bound."),
    "classreport.col_size": ("S（字节）", "S (bytes)"),
    "classreport.col_sent": ("单个进程最多发送（字节）", "Most sent by one rank (bytes)"),
    "classreport.col_bound": ("界（字节）", "Bound (bytes)"),
    "classreport.col_ratio": ("与界之比", "Ratio to the bound"),
}


def add(prefix: str, messages: dict) -> None:
    """An exercise's own messages, under its name (registry.py calls this when it loads one)."""
    for key, pair in (messages or {}).items():
        if isinstance(pair, (tuple, list)) and len(pair) == 2:
            CATALOG[f"{prefix}.{key}"] = (str(pair[0]), str(pair[1]))


def layer(layer_id: str, lang: str) -> str:
    """A sandbox layer id ("pid_ns", "memory_cgroup:2048") in words."""
    name, _, value = layer_id.partition(":")
    return render(f"layer.{name}", {"mb": value}, lang)


def default_lang() -> str:
    lang = os.environ.get("LANG", "") or os.environ.get("LC_ALL", "")
    return "en" if lang.lower().startswith("en") else "zh"


def _word(value, lang: str):
    """A structured parameter in words: bilingual Words, an exception's frames, operations per rank."""
    if isinstance(value, Words):
        return value.zh if lang == "zh" else value.en
    if isinstance(value, CellLines):
        return _cell_words(value, lang)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) and "line" in v and "function" in v for v in value):
        return render("list.sep", {}, lang).join(render("frame", f, lang) for f in value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) and "ops" in v for v in value):
        comma = render("list.comma", {}, lang)
        return render("list.sep", {}, lang).join(
            render("calls.rank", {"rank": v.get("rank"), "ops": comma.join(v.get("ops") or ["-"])}, lang) for v in value)
    if isinstance(value, (list, tuple)) and not value:
        return render("frames.none", {}, lang)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        return render("list.comma", {}, lang).join(map(str, value))
    return value


def _cell_words(value: CellLines, lang: str) -> str:
    """"cell 3, line 29" / "第 3 个单元格第 29 行"; several lines grouped by cell, in their order."""
    cells: dict[int, list[str]] = {}
    for cell, line in value.places:
        cells.setdefault(cell, []).append(str(line))
    comma = render("list.comma", {}, lang)
    return render("list.sep", {}, lang).join(
        render("where.cell_lines" if len(lines) > 1 else "where.cell_line", {"cell": cell, "line": comma.join(lines)}, lang)
        for cell, lines in cells.items())


def _in_cells(template: str, params: dict) -> str:
    """A template whose line is given in a notebook's cells: "line {line}" / "第 {line} 行" become "{line}",
    the words of CellLines saying line and cell."""
    for name, value in params.items():
        if isinstance(value, CellLines):
            template = re.sub(r"\b[Ll]ines? (\{%s[:}])|第 ?(\{%s\}) ?行" % (name, name), lambda m: m.group(1) or m.group(2), template)
    return template


# Formulas (comm.OPS, an exercise's traffic params) are written "2(N-1)/N x S": English keeps x, Chinese
# shows × (as its catalog writes them).
FORMULA_PARAMS = ("formula", "vformula", "sformula")
# English: after a count of 1, the noun it counts is singular ("1 send", "sent 1 time"). Not after an id
# ("rank 1 sends to rank 2": a verb).
SINGULAR = {"times": "time", "sends": "send", "receives": "receive", "ranks": "rank", "students": "student",
            "submissions": "submission", "points": "point", "operations": "operation", "checks": "check",
            "bytes": "byte", "elements": "element", "temporary files": "temporary file",
            "up-to-date results": "up-to-date result", "GPUs": "GPU", "files": "file", "more points": "more point",
            "hidden checks": "hidden check"}
NOT_COUNTS = {"rank", "peer", "other", "source", "to", "frm", "n", "element", "line", "cell", "ws_id"}


def _agree(template: str, values: dict) -> str:
    """English: the nouns counted by a value of 1 in the singular (see SINGULAR)."""
    def fix(match):
        name, noun = match.group(1), match.group(3)
        value = values.get(name)
        one = isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1
        return match.group(0)[:-len(noun)] + SINGULAR[noun] if one and name not in NOT_COUNTS else match.group(0)
    nouns = "|".join(re.escape(n) for n in sorted(SINGULAR, key=len, reverse=True))
    return re.sub(r"\{(\w+)(:[^}]*)?\} (%s)\b" % nouns, fix, template)


def render(key: str, params: dict | None = None, lang: str = "zh") -> str:
    zh, en = CATALOG.get(key, (key, key))
    template = _in_cells(en if lang == "en" else zh, params or {})
    if lang == "en":
        template = _agree(template, params or {})
    values = {k: _word(v, lang) for k, v in (params or {}).items()}
    if lang != "en":
        values.update({k: v.replace(" x ", " × ") for k, v in values.items() if k in FORMULA_PARAMS and isinstance(v, str)})
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError):
        return _partial(template, values)


def _partial(template: str, values: dict) -> str:
    """Fill what can be filled (a value of the wrong type for its format spec stays as text)."""
    def fill(match):
        name, spec = match.group(1), match.group(2) or ""
        if name not in values:
            return match.group(0)
        try:
            return format(values[name], spec)
        except (TypeError, ValueError):
            return str(values[name])
    return re.sub(r"\{(\w+)(?::([^}]*))?\}", fill, template)


def placeholders(key: str) -> set[str]:
    zh, en = CATALOG.get(key, ("", ""))
    return set(re.findall(r"\{(\w+)", zh + en))
