"""`halaman` command line, headless: `ask`, `estimate`, `cache` (`app.entry` starts the desktop app
when `halaman` gets no arguments and hands everything else to `main` here).

    halaman ask book.pdf "What is chapter 3 about?"      stream an answer, then a short report
    halaman find book.pdf "What is chapter 3 about?"     the pages a question would read, and why (no read needed)
    halaman estimate --model llama-3.2-3b --tokens 131072  KV memory: full vs. compressed
    halaman cache list | clear [--yes]                    the prefix-cache store on disk (clear asks first)
    halaman models [pull ID | use ID]                     models that fit this machine; download, choose
    halaman --self-test                                   one short answer on the bundled sample (installer/)
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import threading
from dataclasses import asdict
from pathlib import Path

from engine.cli_history import add_history_command, record_answer
from engine.cli_library import add_library_command
from engine.cli_models import add_models_command, print_warning
from engine.cli_report import ProgressBar, answer_cautions, attended_spans_text
from engine.documents.ocr import recognised_note
from engine.errors import HalamanError
from engine.prompt import check_question
from engine.recall_plan import RecallPlan, RecallSource, plan_recall
from engine.settings import WEIGHTS, CachePolicy, EngineSettings, RecallSettings, load_settings
from engine.units import format_bytes, size_ratio

EXIT_ERROR = 1
EXIT_CANCELLED = 130


def main(argv: list[str] | None = None) -> int:
    """Run the headless command line with `argv`. Returns the process exit code."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(parser_argv(argv))
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.handler(args)
    except HalamanError as exc:
        print(f"halaman: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:  # a path the system refuses before any loader sees it (a name over 255 bytes)
        print(f"halaman: {os_error_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("halaman: cancelled", file=sys.stderr)
        return EXIT_CANCELLED


def os_error_line(exc: OSError) -> str:
    """One line for an OSError about a path: the name (cut in the middle when long) and what the
    system said, with what to do for a name too long (ENAMETOOLONG: over 255 bytes a component)."""
    import errno

    name = str(exc.filename or "")
    short = name if len(name) <= 90 else f"{name[:50]}…{name[-30:]}"
    if exc.errno == errno.ENAMETOOLONG:
        return f"{short}: the file name is too long for this system (over 255 bytes in one name): rename it shorter"
    return f"{short}: {exc.strerror or exc}" if short else str(exc.strerror or exc)


def parser_argv(argv: list[str]) -> list[str]:
    """`argv` as the parser takes it: `halaman --self-test …` is `halaman self-test …` (the
    installer's check), and `ask --library QUESTION` gets an empty PATH, which keeps both of
    `ask`'s positionals required, so options may come between PATH and QUESTION in a plain `ask`
    (argparse cannot intermix options with an optional positional)."""
    if argv[:1] == ["--self-test"]:
        return ["self-test", *argv[1:]]
    if argv[:1] == ["ask"] and "--library" in argv:
        return ["ask", "", *argv[1:]]
    return argv


def command_names() -> set[str]:
    """The names of the `halaman` commands ("ask", "find", "library", ...): a word the command line
    takes as a command, not as a file to open (`app.entry`)."""
    # argparse keeps its subcommands in a private action class: read here, once, not by callers
    return next(set(action.choices) for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))


READ_WHEN = ("later", "after", "first")
"""`halaman ask --read`: when a document not read before is read whole (`DocumentSession.open`'s
read_now, `DocumentSession.read`)."""


def build_parser() -> argparse.ArgumentParser:
    """The `halaman` command line's parser (its commands and options; `command_names` lists the commands)."""
    parser = argparse.ArgumentParser(prog="halaman", description="Ask questions about whole documents with a local model.")
    parser.set_defaults(command=None)
    parser.add_argument("--self-test", action="store_true", help="same as the self-test command")
    sub = parser.add_subparsers(dest="command")

    ask = sub.add_parser("ask", help="answer a question about a PDF, a folder or a text file, or about the whole library",
                         usage="halaman ask PATH QUESTION [options]\n       halaman ask --library QUESTION [options]")
    ask.add_argument("path", help="a PDF, a code folder or a text file (none with --library)")
    ask.add_argument("question")
    ask.add_argument("--library", action="store_true",
                     help="ask every document of the library (`halaman library add`): the best matching ones answer")
    ask.add_argument("--json", action="store_true", help="with --library: print the answer, sources and timings as JSON")
    _conversation_flags(ask)
    ask.add_argument("--password", help="password of an encrypted PDF")
    ask.add_argument("--model", help="'default', a .gguf file, a model folder or a hub id")
    ask.add_argument("--device", choices=("auto", "cpu", "cuda"))
    ask.add_argument("--weights", choices=WEIGHTS,
                     help="4-bit NF4, 4-bit int4 (CPU only) or full-precision weights (auto: NF4 on a GPU, int4 on a CPU)")
    ask.add_argument("--threads", type=int, help="CPU threads (0 = the idle cores, measured; the default)")
    ask.add_argument("--draft-tokens", type=int, dest="draft_tokens",
                     help="prompt-lookup drafts from the document per decode pass (0 = off, the default)")
    ask.add_argument("--max-new-tokens", type=int)
    ask.add_argument("--no-prefix-cache", action="store_true", help="neither read nor write the prefix cache")
    ask.add_argument("--no-history", action="store_true",
                     help="keep the question and answer out of the app's history (`halaman history export`)")
    ask.add_argument("--show-spans", action="store_true", dest="show_spans",
                     help="print the passages the answer attended to most (page or file, characters, share, text)")
    ask.add_argument("--include-generated", action="store_true",
                     help="also read a folder's lock files and generated or vendored files (.gitattributes linguist-*)")
    ask.add_argument("--read", choices=READ_WHEN, default="later",
                     help="a document not read before: 'later' (the default) answers at once from the pages its "
                          "index chooses, re-read for the question; 'after' answers so, then reads the whole "
                          "document and saves its cache for the next questions; 'first' reads it whole, then answers")
    _policy_flags(ask)
    _cloud_flags(ask)
    ask.set_defaults(handler=_cmd_ask)

    find = sub.add_parser("find", help="the pages or parts of files a question would read, best first, and why")
    find.add_argument("path", help="a PDF, a code folder or a text file")
    find.add_argument("question")
    _conversation_flags(find)
    find.add_argument("--limit", type=int, default=10, help="rows besides the chosen ones (default 10)")
    find.add_argument("--json", action="store_true", help="print the rows as JSON")
    find.add_argument("--password", help="password of an encrypted PDF")
    find.add_argument("--model", help="'default', a .gguf file, a model folder or a hub id")
    find.add_argument("--include-generated", action="store_true",
                      help="also read a folder's lock files and generated or vendored files")
    find.set_defaults(handler=_cmd_find)

    est = sub.add_parser("estimate", help="KV-cache memory of a model: full vs. compressed")
    est.add_argument("--model", default="default", help="a model as for ask, or a known shape: " + ", ".join(_known_shapes()))
    est.add_argument("--tokens", type=int, required=True, help="document length in tokens")
    _policy_flags(est)
    est.set_defaults(handler=_cmd_estimate)

    cache = sub.add_parser("cache", help="list or clear the prefix caches on disk")
    cache.add_argument("action", choices=("list", "clear"))
    cache.add_argument("--yes", action="store_true", help="clear without asking (needed when stdin is not a terminal)")
    cache.set_defaults(handler=_cmd_cache)
    add_models_command(sub)
    add_history_command(sub)
    add_library_command(sub)
    _self_test_command(sub)
    return parser


def _conversation_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--after", action="append", default=[], metavar="PREVIOUS",
                        help="an earlier question of the conversation (repeat, oldest first): the question goes on "
                             "from it when its words say so (\"it\", \"and what about …\"), as in the window")
    forced = parser.add_mutually_exclusive_group()
    forced.add_argument("--follow-up", action="store_const", const=True, dest="follow_up",
                        help="with --after: continue from the last question whatever the words")
    forced.add_argument("--new-question", action="store_const", const=False, dest="follow_up",
                        help="with --after: a new question, not continuing from the last one")


def conversation_line(continues: str, after: list[str]) -> str:
    """What `--after` made of the question: "continuing from your last question (refers back: “it”)"
    or "a new question (not continuing from “…”)"; "" without earlier questions."""
    if not after:
        return ""
    return f"continuing from your last question ({continues})" if continues else f"a new question (not continuing from “{after[-1]}”)"


def _policy_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("KV cache policy (defaults from settings.toml)")
    group.add_argument("--budget", type=int, dest="budget_tokens", help="tokens kept per layer and KV head")
    group.add_argument("--sink", type=int, dest="sink_tokens", help="attention-sink tokens")
    group.add_argument("--window", type=int, dest="window_tokens", help="recent-window tokens")
    group.add_argument("--kv-bits", type=int, choices=(4, 8, 16), dest="kv_bits")
    group.add_argument("--group-size", type=int, dest="group_size")
    group.add_argument("--residual", type=int, dest="residual_tokens", help="newest tokens kept in 16-bit")
    group.add_argument("--position-mode", choices=("auto", "original", "compact"), dest="position_mode")
    group.add_argument("--chunk", type=int, dest="chunk_tokens", help="prefill chunk in tokens")
    recall = parser.add_argument_group(
        "recall: the pages chosen for the question (structure, conversation, words: see `halaman find`), from the "
        "on-disk archive (or re-read from the text when the archive does not fit the disk budget); defaults from settings.toml")
    recall.add_argument("--recall-tokens", type=int, dest="recall_tokens",
                        help="tokens per layer and KV head a question may bring back (default 6,144; 0 = none)")
    recall.add_argument("--archive-bits", type=int, choices=(2, 4), dest="archive_bits", help="bits per archived value")
    recall.add_argument("--recall-block", type=int, dest="block_tokens", help="tokens per archive block")
    recall.add_argument("--no-archive", action="store_true", help="do not keep the archive (answers use the snapshot only)")


def _cloud_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "cloud fallback (nothing is sent without --cloud or --cloud-auto; key from $HALAMAN_CLOUD_API_KEY or the OS keyring)")
    group.add_argument("--cloud", action="store_true", help="after the local answer, also ask the cloud model (sends the question and document text)")
    group.add_argument("--cloud-auto", action="store_true", help="ask the cloud model only when the local answer looks unreliable")
    group.add_argument("--cloud-url", help="OpenAI-compatible endpoint for this run, e.g. https://api.example.com/v1 (turns the fallback on)")
    group.add_argument("--cloud-model", help="model name at the endpoint")
    group.add_argument("--yes", action="store_true", help="send without asking even when 'ask before sending' is on")


def drafts_note(drafts) -> str:
    """The decode line's note on prompt-lookup drafts ("; drafts from the document: 5 of 12 accepted
    (4 checking passes)"), or "" when nothing was drafted."""
    if drafts is None or not drafts.drafted:
        return ""
    return f"; drafts from the document: {drafts.accepted} of {drafts.drafted} accepted ({drafts.passes} checking passes)"


def _settings_from(args: argparse.Namespace) -> EngineSettings:
    settings = load_settings(warn=print_warning)
    policy_changes = {name: getattr(args, name) for name in asdict(CachePolicy()) if getattr(args, name, None) is not None}
    recall_changes = {name: getattr(args, name) for name in asdict(RecallSettings()) if getattr(args, name, None) is not None}
    if getattr(args, "no_archive", False):
        recall_changes["archive"] = False
    changes = {"cache": settings.cache.replace(**policy_changes), "recall": settings.recall.replace(**recall_changes)}
    for flag, name in (("model", "model"), ("device", "device"), ("weights", "weights"), ("threads", "threads"), ("draft_tokens", "draft_tokens"),
                       ("max_new_tokens", "max_new_tokens")):
        if getattr(args, flag, None) is not None:
            changes[name] = getattr(args, flag)
    if getattr(args, "no_prefix_cache", False):
        changes["prefix_cache"] = False
    if getattr(args, "include_generated", False):
        changes["include_generated_files"] = True
    return settings.replace(**changes)


def recall_line(stats, plan: RecallPlan | None, pairs: int = 0) -> str:
    """One line on what recall did for an answer (stats: `RecallStats` or None; plan: the open
    document's `RecallPlan`, which says why there was nothing to recall; pairs: the model's layers ×
    KV heads, to give span recall's tokens per layer and KV head, the unit of --recall-tokens)."""
    if stats is None:
        if plan is None or (plan.source is RecallSource.OFF and plan.archive_missing is None):
            return "off"
        if plan.source is RecallSource.WHOLE:
            return "off (the cache keeps the whole document: nothing to recall)"
        if plan.source is RecallSource.OFF:
            return "off (no archive: see the warning above)"
        if plan.source is RecallSource.REREAD:
            return "off for this question (no page was chosen, and without an archive there are no blocks to pick)"
        return "off for this question (the recall budget is 0)"
    if stats.spans:
        each = f"{stats.tokens_recalled // pairs:,} tokens per layer and KV head, " if pairs else ""
        chosen = ([f"{span} ({reason})" for span, reason in zip(stats.spans, stats.reasons, strict=True)]
                  if len(stats.reasons) == len(stats.spans) else stats.spans)
        source = "re-read from the text" if stats.reread else f"{format_bytes(stats.bytes_read)} read from the archive"
        return (f"{', '.join(chosen)} recalled whole: "
                f"{each}{stats.tokens_recalled:,} in all; {source}; {stats.seconds * 1000:.0f} ms")
    return (f"{stats.tokens_recalled:,} tokens in {stats.blocks_recalled:,} blocks (per layer and KV head, all summed) "
            f"of {stats.blocks_scored:,} scored; {format_bytes(stats.bytes_read)} read; "
            f"{stats.seconds * 1000:.0f} ms (score {stats.score_s * 1000:.0f}, read {stats.read_s * 1000:.0f})")


def _cmd_ask(args: argparse.Namespace) -> int:
    from engine.documents import load_document
    from engine.progress import reading_progress
    from engine.workspace import Workspace

    if args.library:
        from engine.cli_library import ask_library
        return ask_library(args.question, args, _settings_from(args))
    if args.json:
        raise HalamanError("--json is for --library questions")
    settings = _settings_from(args)
    if not Path(args.path).exists():
        raise HalamanError(f"{args.path}: no such file or folder; check the path")
    check_question(args.question)  # before the model loads, not after
    settings = _cloud_settings(args, settings)
    err = sys.stderr
    # Read the document before loading the model: a bad file is reported in a second, not after
    # the model's load (tens of seconds on a busy laptop). Reading a 288-page PDF takes about 1 s.
    bar = ProgressBar()
    try:
        document = load_document(args.path, password=args.password, progress=reading_progress(bar.update, args.path),
                                 include_generated=settings.include_generated_files)
    finally:
        bar.close()
    print(f"Loading {settings.model} ...", file=err, flush=True)
    workspace = Workspace(settings)
    model = workspace.ensure_model()
    threads = f", {model.threads} CPU thread{'s' if model.threads != 1 else ''}" if model.threads else ""
    print(f"Model: {model.label} on {model.device}{threads}, weights {format_bytes(model.weight_bytes)} ({model.weights_label}), "
          f"loaded in {model.load_seconds:.1f} s", file=err)
    cancel = threading.Event()

    def announce(plan) -> None:
        # A command line warns and goes on: it may run with no one to answer a prompt. A read the
        # user asked for (--read first or after) is always announced; one the open needs anyway
        # only when it is long.
        if args.read == "later" and not plan.is_long:
            return
        bar.close()
        hint = "; ask about a subfolder to read less" if document.kind == "repo" else ""
        print(f"halaman: {plan.describe()} — Ctrl-C stops{hint}.", file=err, flush=True)

    try:
        opened = workspace.open(document, progress=bar.update, cancel=cancel, on_read_plan=announce,
                                read_now=args.read == "first")
    finally:
        bar.close()
    report = opened.report
    for warning in report.warnings[:10]:
        print(f"warning: {warning}", file=err)
    if len(report.warnings) > 10:
        print(f"warning: ... and {len(report.warnings) - 10} more", file=err)
    follow_up = _assume_asked(args, workspace)
    answer = workspace.ask(args.question, follow_up=follow_up, on_text=lambda piece: print(piece, end="", flush=True),
                           cancel=cancel)
    print()
    if not args.no_history:
        try:
            record_answer(opened, args.question, workspace.answer_record(answer))
        except (sqlite3.Error, OSError) as exc:  # the answer is printed already: say it was not kept, do not fail
            print(f"halaman: the answer was not kept in the history ({exc})", file=err)
    _print_report(report, answer, settings, workspace)
    if answer.sources:
        shown = document.shown_labels()  # "page 48 (PDF page 68)" where the PDF prints another number
        print("sources         " + "; ".join(f"[{shown.get(s.label, s.label)}] {s.share:.0%}" for s in answer.sources))
    recognised = recognised_note(document.recognised_pages, [s.page for s in answer.sources])
    for caution in answer_cautions(answer, settings) + ([recognised] if recognised else []):
        print(f"check           {caution}")
    if args.show_spans:
        print("attended spans  " + attended_spans_text(answer, document))
    if report.unread:
        _read_after(args, workspace, bar, cancel)
    if args.cloud or args.cloud_auto:
        return _ask_cloud_after(args, workspace, answer, cancel)
    return 0


def _assume_asked(args: argparse.Namespace, workspace) -> bool | None:
    """`ask --after`: the earlier questions become the conversation (unanswered), and the line that
    says whether the question continues from the last one, decided as the window decides it.
    Returns `follow_up` for `Workspace.ask` (False without --after: a question alone is new)."""
    if not args.after:
        return False
    workspace.assume_asked(args.after)
    continues = workspace.session.continues(args.question, args.follow_up)
    print(f"halaman: {conversation_line(continues, args.after)}", file=sys.stderr, flush=True)
    return args.follow_up


def _print_report(report, answer, settings: EngineSettings, workspace) -> None:
    """`halaman ask`'s report after the answer: the document, the cache, the prefix cache, timings,
    decoding and recall (`report`: the document's `OpenReport`)."""
    policy = settings.cache
    profile = workspace.model.profile if workspace.model is not None else None
    pairs = profile.num_layers * profile.kv_heads if profile is not None else 0
    print(
        "\n--- report ---\n"
        f"document        {report.title} ({report.kind}, {report.document_tokens:,} tokens"
        f"{f', {report.pages} pages' if report.pages else ''})\n"
        f"cache policy    budget {policy.budget_tokens:,} tokens = sink {policy.sink_tokens} + window {policy.window_tokens:,}"
        f" + heavy hitters; INT{policy.kv_bits} group {policy.group_size}; positions {report.position_mode}\n"
        + (f"KV cache held   none yet (not read); full FP16 would be {format_bytes(report.full_fp16_bytes)}\n" if report.unread else
           f"KV cache held   {format_bytes(report.kv.total_bytes)} ({report.kv.total_bytes:,} bytes) vs. full FP16 "
           f"{format_bytes(report.full_fp16_bytes)} ({size_ratio(report.full_fp16_bytes, report.kv.total_bytes)})\n") +
        f"prefix cache    {'hit' if report.prefix_hit else 'miss'}"
        f"{'' if report.prefix_hit or report.unread else f' (prefill {report.prefill_seconds:.1f} s, {report.prefill_tokens_per_s:,.0f} tokens/s)'}"
        f"{' (not read yet: answered from its index)' if report.unread else ''}"
        f"{'' if settings.prefix_cache else ' (disabled)'}\n"
        f"TTFT            {answer.time_to_first_token_s:.2f} s (open {report.seconds:.1f} s before it)\n"
        f"decode          {answer.decode_tokens_per_s:.1f} tokens/s, {len(answer.token_ids)} tokens, stop: {answer.stop_reason}"
        f"{drafts_note(answer.drafts)}\n"
        f"recall          {recall_line(answer.recall, report.recall_plan, pairs)}"
    )


def _read_after(args: argparse.Namespace, workspace, bar: ProgressBar, cancel: threading.Event) -> None:
    """The whole read of a document answered before it was read (`--read after`), or the line that
    says it was not read."""
    err = sys.stderr
    if args.read != "after":
        print("read            not yet: the answer re-read the parts of the document its index chose; `--read after` "
              "reads the whole document once and saves it, so later questions recall from it", file=err)
        return
    def announce(plan) -> None:
        print(f"halaman: reading the whole document for the next questions, {plan.describe()} — Ctrl-C stops; "
              "nothing is kept then.", file=err, flush=True)

    try:
        workspace.read(progress=bar.update, cancel=cancel, on_read_plan=announce)
    finally:
        bar.close()
    report = workspace.session.report
    print(f"read            {report.document_tokens:,} tokens in {report.prefill_seconds:.1f} s "
          f"({report.prefill_tokens_per_s:,.0f} tokens/s); saved: the next question starts from it", file=err)


def _cmd_find(args: argparse.Namespace) -> int:
    import json

    from engine.find import find_spans
    from engine.progress import reading_progress

    settings = _settings_from(args)
    if not Path(args.path).exists():
        raise HalamanError(f"{args.path}: no such file or folder; check the path")
    check_question(args.question)
    bar = ProgressBar()
    try:  # the model's tokenizer alone: no weights are loaded (engine.find)
        found = find_spans(args.path, args.question, settings, after=args.after, follow_up=args.follow_up,
                           limit=args.limit, password=args.password, progress=reading_progress(bar.update, args.path))
    finally:
        bar.close()
    if args.after:
        print(f"halaman: {conversation_line(found.continues, args.after)}", file=sys.stderr)
    if args.json:
        print(json.dumps([asdict(row) for row in found.rows], indent=1, ensure_ascii=False))
        return 0
    for row in found.rows:
        name = row.shown or row.label  # the page as printed, where the PDF numbers it otherwise
        where = name if row.whole else f"{name} lines {row.line_start}–{row.line_end}"
        mark = "read" if row.chosen else "    "
        print(f"{row.rank:>3}. {mark}  {where}  ({row.tokens:,} tokens)  {row.why}")
    return 0


def _cloud_settings(args: argparse.Namespace, settings: EngineSettings) -> EngineSettings:
    """`settings` with the cloud flags applied (unchanged without --cloud / --cloud-auto).
    Raises HalamanError when the fallback is off (checked before any work, nothing is sent)."""
    if not (args.cloud or args.cloud_auto):
        return settings
    changes = {"enabled": True, "base_url": args.cloud_url} if args.cloud_url else {}
    if args.cloud_auto:  # escalate when the local answer looks unreliable: that is what the flag asks
        changes["auto_escalate"] = True
    if args.cloud_model:
        changes["model"] = args.cloud_model
    if args.max_new_tokens is not None:  # the answer's limit holds for the cloud answer too
        changes["max_tokens"] = args.max_new_tokens
    cloud = settings.cloud.replace(**changes)
    if not cloud.enabled:
        raise HalamanError("cloud fallback is off, so nothing was sent: turn it on in settings.toml [cloud] "
                           "or pass --cloud-url and --cloud-model")
    return settings.replace(cloud=cloud)


def _ask_cloud_after(args: argparse.Namespace, workspace, answer, cancel) -> int:
    """`--cloud`: always escalate after the local answer; `--cloud-auto`: only when
    `escalation_reason` gives a reason."""
    import os

    from engine.cloud.report import plan_lines, provenance_lines

    cloud = workspace.settings.cloud
    reason = "user asked (--cloud)"
    if not args.cloud:
        reason = workspace.escalation_reason(answer)
        if reason is None:
            print(f"\ncloud: not asked (the local answer looks reliable: mean log-probability {answer.mean_logprob:.2f})")
            return 0

    def confirm(plan) -> bool:
        print("\n".join(["", "--- cloud request ---", *plan_lines(plan)]), file=sys.stderr)
        if cloud.ask_before_sending and not args.yes and sys.stdin.isatty():
            return input("Send this to the cloud? [y/N] ").strip().lower() in ("y", "yes")
        return True  # --cloud / --cloud-auto on a command line with no terminal to ask is the consent

    print(f"\n--- cloud answer ({reason}) ---", flush=True)
    cloud_answer = workspace.ask_cloud(args.question, reason=reason, cancel=cancel, confirm=confirm,
                                       on_text=lambda piece: print(piece, end="", flush=True),
                                       api_key=os.environ.get("HALAMAN_CLOUD_API_KEY") or None)
    if cloud_answer is None:
        print("(not sent)")
        return 0
    print("\n".join(["", "", "--- cloud report ---", *provenance_lines(cloud_answer)]))
    return 0


def _cmd_estimate(args: argparse.Namespace) -> int:
    from engine.estimate import KNOWN_SHAPES, estimate
    from engine.models.loader import profile_for

    settings = _settings_from(args)
    profile = KNOWN_SHAPES.get(args.model.lower()) or profile_for(args.model)
    if args.tokens < 1:
        raise HalamanError("--tokens must be at least 1")
    result = estimate(profile, settings.cache, args.tokens, settings.recall)
    policy, recall = settings.cache, settings.recall
    per_token = result.full_bytes // args.tokens
    print(
        f"model shape     {args.model}: L={profile.num_layers} layers, H_kv={profile.kv_heads} KV heads, "
        f"D={profile.head_dim}, max positions {profile.max_positions:,}\n"
        f"full FP16 cache 2·L·H_kv·D·2 bytes = {per_token:,} bytes/token; "
        f"{args.tokens:,} tokens = {result.full_bytes:,} bytes ({format_bytes(result.full_bytes)})\n"
        f"compressed      budget {policy.budget_tokens:,} (sink {policy.sink_tokens} + window {policy.window_tokens:,} "
        f"+ heavy hitters), INT{policy.kv_bits} group {policy.group_size}, residual {policy.residual_tokens}: "
        f"{result.compressed_bytes:,} bytes ({format_bytes(result.compressed_bytes)}), "
        f"{size_ratio(result.full_bytes, result.compressed_bytes)}\n"
        f"prefill peak    {result.peak_bytes:,} bytes ({format_bytes(result.peak_bytes)}) with {policy.chunk_tokens}-token chunks"
    )
    if recall.archive:
        plan = plan_recall(settings, profile, args.tokens,
                           disk_budget_bytes=settings.prefix_cache_disk_bytes if settings.prefix_cache else None)
        written = "written" if plan.uses_archive else "not written"
        print(
            f"archive (disk)  every token, INT{recall.archive_bits} + block bounds: {result.archive_bytes:,} bytes "
            f"({format_bytes(result.archive_bytes)}, {result.archive_bytes // args.tokens:,} bytes/token); {written}\n"
            f"recall (memory) {recall.recall_tokens:,} tokens per layer and KV head while a question is answered: "
            f"{result.recall_bytes:,} bytes ({format_bytes(result.recall_bytes)})\n"
            f"recall          {plan.source}: {plan.reason}"
        )
    if profile.max_positions < args.tokens:
        print(f"note            {args.tokens:,} tokens exceed the model's {profile.max_positions:,} positions: "
              "'auto' uses compact positions")
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from engine.workspace import Workspace

    settings = load_settings(warn=print_warning)
    workspace = Workspace(settings)
    if args.action == "clear":
        if not args.yes and not _confirm_clear():
            print("nothing deleted")
            return 0
        removed = workspace.clear_prefix_cache()
        _print_notices(workspace)
        print(f"removed {removed} prefix cache entr{'y' if removed == 1 else 'ies'}")
        return 0
    entries = workspace.prefix_entries()
    _print_notices(workspace)
    if entries is None:
        print("no entries can be listed; `halaman cache clear` deletes the cache files")
        return 0
    for entry in entries:
        archive = f"+ archive {format_bytes(entry.archive_bytes)}" if entry.archive_bytes else "no archive"
        print(f"{entry.key[:12]}  {format_bytes(entry.size_bytes):>10}  {archive:>18}  {entry.n_tokens:>8,} tokens  {entry.label}")
    _, total = workspace.prefix_cache_usage()
    print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {format_bytes(total)} of {format_bytes(settings.prefix_cache_disk_bytes)}")
    return 0


def _confirm_clear() -> bool:
    """Whether the user agrees to delete the prefix cache, asked on the terminal with what it holds.
    Raises HalamanError when stdin is not a terminal: a script must say --yes, not be assumed to."""
    from engine.prefix_store import stored_size
    from engine.workspace import prefix_store_dir

    root = prefix_store_dir()
    entries, size = stored_size(root)
    if entries == 0 and size == 0:
        return True  # nothing to lose: clearing only tidies the index
    what = f"{entries} entr{'y' if entries == 1 else 'ies'}, {size:,} bytes ({format_bytes(size)})"
    if not sys.stdin.isatty():
        raise HalamanError(f"cache clear would delete the prefix cache in {root} ({what}); "
                           "stdin is not a terminal to ask on, so pass --yes to delete it")
    try:
        reply = input(f"Delete the prefix cache in {root}: {what}, the saved reads of every document "
                      "(each is read again when next opened)? [y/N] ")
    except EOFError:
        return False
    return reply.strip().lower() in ("y", "yes")


def _print_notices(workspace) -> None:
    """The workspace's notices (a prefix store that cannot be used) as warning lines on stderr."""
    for notice in workspace.notices:
        print(f"warning: {notice}", file=sys.stderr)
    workspace.notices.clear()


def _known_shapes() -> list[str]:
    from engine.estimate import KNOWN_SHAPES

    return sorted(KNOWN_SHAPES)


# ------------------------------------------------------------------ self-test
# `halaman --self-test`: the installer (installer/) runs it at the end of the first-run set-up and
# shows its figures to the user; exit status 0 only if the default model answered.

SELF_TEST_QUESTION = "What does the prefix cache do?"
SAMPLE_DOCUMENT = "kv-cache-primer.md"


def _self_test_command(sub) -> None:
    test = sub.add_parser("self-test", help="load the default model and answer one question on the bundled sample")
    test.add_argument("--document", help=f"the document to ask about (default: the bundled {SAMPLE_DOCUMENT})")
    test.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    test.add_argument("--max-new-tokens", type=int, default=16)
    test.add_argument("--no-prefix-cache", action="store_true", help="neither read nor write the prefix cache")
    test.set_defaults(handler=_cmd_self_test)


def sample_document() -> Path | None:
    """The bundled sample: in a checkout under resources/samples/; in an environment the installer
    prepared, under <environment>/share/halaman/samples/ (installer/ copies it there)."""
    for candidate in (Path(__file__).resolve().parent.parent / "resources" / "samples" / SAMPLE_DOCUMENT,
                      Path(sys.prefix) / "share" / "halaman" / "samples" / SAMPLE_DOCUMENT):
        if candidate.is_file():
            return candidate
    return None


def _cmd_self_test(args: argparse.Namespace) -> int:
    """Default model, default settings (settings.toml is ignored), a 512-token budget, a short answer."""
    import time

    began = time.perf_counter()
    document = Path(args.document) if args.document else sample_document()
    if document is None or not document.is_file():
        raise HalamanError(f"self-test: the sample document {args.document or SAMPLE_DOCUMENT} was not found; "
                           "pass --document FILE")
    try:
        from engine.workspace import Workspace

        settings = EngineSettings().replace(
            device=args.device, max_new_tokens=args.max_new_tokens, prefix_cache=not args.no_prefix_cache,
            cache=CachePolicy().replace(budget_tokens=512, window_tokens=128, residual_tokens=64))
        print("Halaman self-test: loading the default model ...", file=sys.stderr, flush=True)
        workspace = Workspace(settings)
        model = workspace.ensure_model()
        report = workspace.open(str(document)).report
        answer = workspace.ask(SELF_TEST_QUESTION)
    except Exception as exc:  # noqa: BLE001 - any failure is the result: report it in one line, exit 1
        print(f"self-test FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    passed = bool(answer.token_ids) and bool(answer.text.strip())
    print(
        f"model           {model.label}, loaded in {model.load_seconds:.1f} s\n"
        f"device          {model.device}\n"
        f"weights         {model.weight_bytes:,} bytes ({format_bytes(model.weight_bytes)}, {model.weights_label})\n"
        f"document        {document.name}: {report.document_tokens:,} tokens\n"
        f"KV cache held   {report.kv.total_bytes:,} bytes ({format_bytes(report.kv.total_bytes)}); full FP16 "
        f"{report.full_fp16_bytes:,} bytes\n"
        f"prefix cache    {'hit' if report.prefix_hit else 'miss'}{'' if settings.prefix_cache else ' (disabled)'}\n"
        f"TTFT            {answer.time_to_first_token_s:.2f} s\n"
        f"decode          {answer.decode_tokens_per_s:.1f} tokens/s, {len(answer.token_ids)} tokens\n"
        f"question        {SELF_TEST_QUESTION}\n"
        f"answer          {' '.join(answer.text.split())}"
    )
    if not passed:
        print("self-test FAILED: the model produced no answer", file=sys.stderr)
        return EXIT_ERROR
    print(f"self-test passed in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
