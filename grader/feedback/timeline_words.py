"""The words of the space-time diagram and the trace (timeline.py, trace.py), in Chinese and English.

They join the one catalog (messages.CATALOG, under "timeline."), so they are rendered as every message is: a
notebook's lines as "cell 3, line 29", lists in the reader's punctuation, English counts of one singular.
"""
from __future__ import annotations

from .messages import CATALOG, render

WORDS: dict[str, tuple[str, str]] = {
    "page_title": ("{file}：各进程的时空图", "{file}: space-time diagram of the ranks"),
    "figure": ("各进程的时空图", "Space-time diagram of the ranks"),
    "caption": ("进程数 {ws} 的运行，交换机记录了 {ops} 个通信操作。{stop}", "The run at world size {ws}: the switch recorded {ops} operations. {stop}"),
    "none": ("没有可画的运行：代码没有在可见的进程数下运行。", "No run to draw: the code did not run at the visible world size."),
    "lane": ("进程 {rank}", "rank {rank}"),
    "axis": ("交换机时钟 →", "switch clock →"),
    # one operation (a box's title)
    "op": ("进程 {rank} 的第 {n} 个操作：{name}", "rank {rank}, operation #{n}: {name}"),
    "op_group": ("组 {group}", "group {group}"),
    "op_to": ("发给进程 {peer}", "to rank {peer}"),
    "op_from": ("来自进程 {peer}", "from rank {peer}"),
    "op_any": ("来自任意进程", "from any rank"),
    "op_size": ("{numel} 个 {dtype} 元素", "{numel} {dtype} elements"),
    "op_line": ("第 {line} 行", "line {line}"),
    "op_time": ("时钟 {entered} 进入，{completed} 完成", "entered at clock {entered}, completed at {completed}"),
    "op_never": ("时钟 {entered} 进入，没有完成", "entered at clock {entered}, never completed"),
    "state_blocked": ("‖ 运行结束时进程正在等它", "‖ the rank was waiting on it when the run ended"),
    "state_open": ("没有完成（进程没有等它）", "not completed (the rank did not wait on it)"),
    "failed.diverged": ("✕ 各进程的调用对不上：{calls}", "✕ the ranks' calls did not fit together: {calls}"),
    "failed.message": ("✕ 消息放不进接收缓冲区：进程 {sender} 发送 {sent} 个 {sent_dtype} 元素，进程 {receiver} 的缓冲区是 {room} 个 {room_dtype} 元素",
                       "✕ the message did not fit its receive buffer: rank {sender} sent {sent} {sent_dtype} elements, rank {receiver}'s buffer holds {room} {room_dtype}"),
    "failed.group_name": ("✕ 组名 {name} 既用于进程 {other}，又用于进程 {ranks}", "✕ the group name {name} was made for ranks {other} and for ranks {ranks}"),
    "failed.error": ("✕ 出错：{error}", "✕ error: {error}"),
    "waits.collective": ("进程 {ranks} 还没有调用它", "rank {ranks} had not called it"),
    "waits.collective_many": ("进程 {ranks} 还没有调用它", "ranks {ranks} had not called it"),
    "waits.p2p": ("进程 {peer} 没有发起与它匹配的 {other}", "rank {peer} posted no matching {other}"),
    "waits.any": ("没有进程发起与它匹配的 {other}", "no rank posted a matching {other}"),
    "waits.unknown": ("其他进程的调用没有与它配对", "no call of the other ranks paired with it"),
    # what the drawing shows as text
    "blocked": ("‖ 卡在 {name}", "‖ blocked in {name}"),
    "blocked_line": ("‖ 卡在 {name}（第 {line} 行）", "‖ blocked in {name} (line {line})"),
    "diverged": ("✕ 调用对不上", "✕ calls differ"),
    "message": ("进程 {src} → 进程 {dst}：{numel} 个 {dtype} 元素，时钟 {sent} 发出，{delivered} 送达",
                "rank {src} → rank {dst}: {numel} {dtype} elements, sent at clock {sent}, delivered at {delivered}"),
    "message_bad": ("进程 {src} → 进程 {dst}：{numel} 个 {dtype} 元素，放不进接收缓冲区，没有送达",
                    "rank {src} → rank {dst}: {numel} {dtype} elements; it did not fit the receive buffer and was not delivered"),
    "band": ("{name}（组 {group} 上的第 {n} 个），时钟 {at} 在组内每个进程上完成", "{name} (#{n} on group {group}) completed on every rank of its group at clock {at}"),
    "band_bad": ("{name}（组 {group}）：各进程的调用对不上，时钟 {at} 每个进程都收到错误", "{name} (group {group}): the ranks' calls did not fit together; every rank got an error at clock {at}"),
    # how each rank ended
    "end.returned": ("✓ 返回", "✓ returned"),
    "end.raised": ("✕ 抛出 {type}", "✕ raised {type}"),
    "end.raised_line": ("✕ 抛出 {type}（第 {line} 行）", "✕ raised {type} (line {line})"),
    "end.load_error": ("✕ 加载代码时抛出 {type}", "✕ raised {type} while loading"),
    "end.exited": ("✕ 提前退出", "✕ exited early"),
    "end.killed": ("✕ 被信号 {signal} 终止", "✕ killed by signal {signal}"),
    "end.blocked": ("‖ 运行结束时仍在等待", "‖ still waiting when the run ended"),
    "end.running": ("… 运行结束时仍在运行，不在通信中", "… still running when the run ended, in no operation"),
    "end.unknown": ("？没有报告结果", "? reported no result"),
    # how the run ended
    "stop.completed": ("运行正常结束。", "The run completed."),
    "stop.deadlock": ("■ 死锁：再没有操作能完成", "■ deadlock: no operation could complete any more"),
    "stop.timeout": ("■ 到达时间限制", "■ time limit reached"),
    "stop.failfast": ("■ 进程 {rank} 失败，运行被停止", "■ rank {rank} failed: the run was stopped"),
    "stop.process_limit": ("■ 进程数超过限制，运行被停止", "■ too many processes: the run was stopped"),
    "stop.output_limit": ("■ 输出超过限制，运行被停止", "■ too much output: the run was stopped"),
    "stop.traffic_limit": ("■ 通信量超过限制，运行被停止", "■ too much traffic through the switch: the run was stopped"),
    "stop.protocol": ("■ 进程发来了评分器不接受的数据，运行被停止", "■ a rank sent the grader what no honest rank sends: the run was stopped"),
    "stop.grader_error": ("■ 评分器出错", "■ the grader failed"),
    "stop.cancelled": ("■ 运行被取消", "■ the run was cancelled"),
    # what was left out
    "hidden": ("… 时钟 {first} 到 {last} 之间的 {n} 个操作没有画出 …", "… {n} operations between clocks {first} and {last} not drawn …"),
    "hidden_rank": ("进程 {rank}：{n} 个操作没有画出：{names}", "rank {rank}: {n} operations not drawn: {names}"),
    "hidden_name": ("{name} ×{n}", "{name} x{n}"),
    "hidden_count": ("{n} 个", "{n} ops"),
    # the legend
    "legend": ("图例", "Legend"),
    "legend.lane": ("每一行是一个进程；时间从左到右，按交换机的时钟：它收到和完成的事件的计数，不是秒。",
                    "Each row is a rank; time runs left to right on the switch's clock: a count of the events it received and completed, not seconds."),
    "legend.box": ("方框：一个通信操作，从交换机收到它到它完成；写着操作名、组和大小（元素个数与类型）。把鼠标停在方框上可看详情。",
                   "A box: one operation, from when the switch took it to when it completed, labelled with its name, group and size (elements and dtype). Hover over it for details."),
    "legend.arrow": ("箭头：点对点消息，从发送方的 send 到送达接收方，标着元素个数。", "An arrow: a point-to-point message, from the sender's send to its delivery, labelled with its element count."),
    "legend.band": ("竖条：一个集合通信在组内每个进程上同时完成；圆点标出组内的进程，颜色表示组：",
                    "A bar across rows: a collective completing on every rank of its group at once; dots mark the group's ranks, and its colour is the group's:"),
    "legend.group": ("组 {group}", "group {group}"),
    "legend.blocked": ("‖ 带斜线、右端开口的方框：运行结束时进程还在等待的操作。", "‖ A hatched box open to the right: an operation the rank was still waiting on when the run ended."),
    "legend.open": ("虚线方框：没有完成、进程也没有等待的操作。", "A dashed box: an operation that never completed and that the rank did not wait on."),
    "legend.failed": ("✕ 红框：出错的操作（各进程的调用对不上、消息放不进接收缓冲区等）。", "✕ A red box: an operation that failed (the ranks' calls did not fit together, a message did not fit its buffer ...)."),
    "legend.ends": ("每行右边：这个进程如何结束（✓ 返回，✕ 抛出异常，‖ 仍在等待）。", "At the right of each row: how the rank ended (✓ returned, ✕ raised, ‖ still waiting)."),
    "legend.bound": ("操作超过 {limit} 个时，只画出交换机最先收到的 {head} 个和最后收到的 {tail} 个，中间的按进程计数。",
                     "A run of more than {limit} operations shows the first {head} and the last {tail} the switch took; those between are counted per rank."),
}
CATALOG.update({f"timeline.{key}": words for key, words in WORDS.items()})


def say(key: str, params: dict | None = None, lang: str = "zh") -> str:
    return render(f"timeline.{key}", params or {}, lang)


def why(reason: tuple, lang: str) -> str:
    """An operation's (words key, params): why it failed, or whom it waited for."""
    key, params = reason
    if key == "waits.collective" and len(params.get("ranks", ())) > 1:
        key = "waits.collective_many"
    return say(key, params, lang)


def stop(view, lang: str) -> str:
    """How the run ended (a stop reason this catalog does not know is shown as it is)."""
    key = f"stop.{view.stop}"
    return say(key, {"rank": view.stop_rank}, lang) if f"timeline.{key}" in CATALOG else str(view.stop)


def ending(end, lang: str) -> str:
    """How one rank ended (runview.End)."""
    if end.how == "raised" and end.line is not None:
        return say("end.raised_line", {"type": end.type, "line": end.line}, lang)
    return say(f"end.{end.how}", {"type": end.type, "signal": end.signal}, lang)
