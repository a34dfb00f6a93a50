"""The exercise: finding it, what its declaration got wrong (exercise/validate.py says where), and why a release
of its student version was refused.
(One part of the catalog: feedback/messages.py joins the parts into CATALOG.)"""

MESSAGES: dict[str, tuple[str, str]] = {
    # --- titles
    "title.hidden": ("隐藏测试 {n}：{what}", "Hidden check {n}: {what}"),
    "title.grader_failed": ("自动评分器出错", "Autograder failed"),
    # --- which exercise
    "exercise.none": ("没有找到任何练习（solutions/*/exercise.py）。", "No exercise was found (solutions/*/exercise.py)."),
    "exercise.unknown": ("没有名为 {name} 的练习。现有练习：{known}。", "There is no exercise called {name}. Exercises: {known}."),
    "exercise.ambiguous": ("无法判断这份提交属于哪个练习，请用 --exercise 指定（现有练习：{known}）。",
                           "Cannot tell which exercise this submission is for: choose one with --exercise (exercises: {known})."),
    "exercise.broken": ("练习定义 {path} 无法加载：{error}", "The exercise definition {path} cannot be loaded: {error}"),
    # --- an exercise's declaration: exercise/validate.py; the place (file:line) is said before
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
                          "{where}: no {begin} / {end} region: the student version would hold the whole answer. Nothing was released."),
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
}
