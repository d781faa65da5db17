"""Every promise of a refusal or an error in the README and the documentation
site has a test that shows it.

The pages' sentences that promise one are found by a pattern ("is refused",
"raises", "an error", "fails", "exits with status 1", ...) in their prose,
list items and table rows. ``PROMISES`` maps each such sentence, by its page
and a phrase of it, to the tests that show it; ``NOT_PROMISES`` names the
sentences the pattern finds that promise nothing of fastdata's (another
tool's behaviour, the test suite's own rules), with the reason. A sentence in
neither table fails the table's test, so a new promise comes with its test;
an entry whose phrase no sentence holds any more, or whose test does not
exist, fails too.

A few promises had no test of their own; they are here, below the tables:
a resume state under another batch size and rank count, a stream's length
per rank, a label join that lost a race, an interrupted pack of the earlier
state layout, the per-format Dataset classes on another format, and a Dask
cluster whose worker lacks fastdata or dies running a piece.
"""

from __future__ import annotations

import copyreg
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_docs_style import pages, units  # noqa: E402

#: What a sentence that promises a refusal or an error says.
PROMISE = re.compile(r"\b(?:refus(?:ed|es|e|al)|raises?|an error|errors?:|fails?|failing"
                     r"|exits? (?:with )?(?:code|status) [1-9])", re.IGNORECASE)

# (page, a phrase of the sentence) -> the tests that show it.
PROMISES: dict[tuple[str, str], list[str]] = {
    # README.md
    ("README.md", "one saved under another order or random crop is refused"): [
        "tests/test_stream_resume.py::test_refuses_a_state_of_another_order",
        "tests/test_resume_descriptions.py::test_a_state_under_another_random_crop_is_refused"],
    # docs/index.md
    ("docs/index.md", "Names and links that lead outside a dataset are refused"): [
        "tests/test_contained.py::test_names_that_leave_the_folder_are_refused",
        "tests/test_contained.py::test_every_hostile_name_is_refused_by_every_command"],
    # docs/concepts.md
    ("docs/concepts.md", "one saved under other values is refused"): [
        "tests/test_sampler.py::test_a_state_of_another_order_or_dataset_is_refused"],
    # docs/changing.md
    ("docs/changing.md", "A key the dataset holds already is refused"): [
        "tests/test_versions.py::test_cli_append_refuses_present_keys_then_skips_them"],
    ("docs/changing.md", "Other values are refused before anything is packed"): [
        "tests/test_versions.py::test_append_takes_the_datasets_preprocessing_and_refuses_another"],
    ("docs/changing.md", "Loading it into another version is refused"): [
        "tests/test_versions.py::test_map_style_resume_is_refused_on_another_version",
        "tests/test_versions.py::test_resume_point_is_refused_on_another_version"],
    ("docs/changing.md", "refused if another append added one of its keys"): [
        "tests/test_commit.py::test_appends_whose_keys_collide_one_lands_the_other_says_what_to_do"],
    ("docs/changing.md", "a join of a column just joined"): [
        "tests/test_commit.py::test_two_joins_of_different_columns_at_once_both_land"],
    ("docs/changing.md", "refused if the dataset changed since it read the labels"): [
        "tests/test_doc_promises.py::test_a_label_join_that_lost_a_race_is_refused"],
    ("docs/changing.md", "A refused change removes its own files"): [
        "tests/test_commit.py::test_eight_appends_at_once_each_land_exactly_once",
        "tests/test_commit.py::test_appends_whose_keys_collide_one_lands_the_other_says_what_to_do"],
    ("docs/changing.md", "left by refused or interrupted changes"): [
        "tests/test_versions.py::test_a_refused_append_leaves_no_part_and_gc_removes_orphans"],
    ("docs/changing.md", "An append whose part was removed anyway refuses to commit"): [
        "tests/test_commit.py::test_a_part_removed_before_its_commit_fails_the_append_clearly"],
    ("docs/changing.md", "a linked history folder is refused"): [
        "tests/test_commit.py::test_gc_never_follows_a_link"],
    ("docs/changing.md", "A call is refused"): [
        "tests/test_views.py::test_where_over_metadata_and_key_label_class"],
    ("docs/changing.md", "a cell that does not read as its column's type"): [
        "tests/test_join.py::test_csv_cells_stay_text_unless_types_are_given"],
    ("docs/changing.md", "one that does not fit int64 is refused"): [
        "tests/test_join.py::test_jsonl_values_keep_their_types"],
    ("docs/changing.md", "A UTF-16 table, or bytes that are not UTF-8, are refused"): [
        "tests/test_join.py::test_tables_that_are_not_utf8_are_refused_naming_the_line"],
    # docs/development/
    ("docs/development/architecture.md", "fails on every cycle"): [
        "tests/test_import.py::test_fastdata_has_no_import_cycles",
        "tests/test_import.py::test_cycles_are_found_and_shown_as_chains"],
    ("docs/development/extending.md", "refuses one the output's format lacks"): [
        "tests/test_contract.py::test_the_toy_format_s_writer_option_is_on_the_command_line",
        "tests/test_interop.py::test_split_names_timm_cannot_look_up"],
    ("docs/development/extending.md", "(refused without `--overwrite`)"): [
        "tests/test_remote.py::test_pack_straight_to_s3_gives_the_local_records"],
    ("docs/development/tests.md", "A test whose component is missing"): [
        "tests/test_ci_needs.py::test_a_missing_component_fails_in_ci",
        "tests/test_ci_needs.py::test_in_ci_a_skip_not_allowed_fails_naming_the_test_and_the_reason"],
    ("docs/development/tests.md", "and the refusal that 3.0 gives is tested"): [
        "tests/test_ci_needs.py::test_in_ci_a_skip_not_allowed_fails_naming_the_test_and_the_reason"],
    ("docs/development/tests.md", "every sentence that promises a refusal or"): [
        "tests/test_doc_promises.py::test_every_promise_names_a_test"],
    ("docs/development/tests.md", "A probe never raises"): [
        "tests/test_optional.py::test_a_missing_parent_package_is_an_answer_not_an_error"],
    ("docs/development/tests.md", "`tests/test_optional.py` fails on a `find_spec`"): [
        "tests/test_optional.py::test_hiding_what_is_imported_already_is_refused"],
    ("docs/development/tests.md", "these skips fail like any other"): [
        "tests/test_ci_needs.py::test_in_ci_a_skip_not_allowed_fails_naming_the_test_and_the_reason"],
    # docs/formats/
    ("docs/formats/index.md", "readers refuse newer versions"): [
        "tests/test_hdf5.py::test_newer_manifest_or_schema",
        "tests/test_lmdb.py::test_manifest_from_newer_version"],
    ("docs/formats/interop.md", "`--split` refuses such a name"): [
        "tests/test_interop.py::test_split_names_timm_cannot_look_up"],
    ("docs/formats/lmdb.md", "lmdb refuses to open a file twice in a process"): [
        "tests/test_lmdb.py::test_two_datasets_on_one_path"],
    ("docs/formats/tfrecord.md", "a mismatch raises an error naming the"): [
        "tests/test_tfrecord.py::test_flipped_data_byte_fails_crc_with_file_and_offset"],
    # docs/packing/
    ("docs/packing/bad-input.md", "The same, with `--strict`"): [
        "tests/test_cli.py::test_unreadable_file_is_skipped"],
    ("docs/packing/bad-input.md", "where Pillow refuses decompression bombs"): [
        "tests/test_cli.py::test_max_pixels_flag_skips_images_over_the_limit"],
    ("docs/packing/bad-input.md", "SOURCE missing"): ["tests/test_cli.py::test_pack_errors"],
    ("docs/packing/bad-input.md", "An unknown output extension"): [
        "tests/test_cli.py::test_pack_errors"],
    ("docs/packing/bad-input.md", "An output extension of another format than `--format`"): [
        "tests/test_names.py::test_cli_refuses_an_extension_that_contradicts_format"],
    ("docs/packing/bad-input.md", "OUTPUT exists"): [
        "tests/test_cli.py::test_existing_output_needs_overwrite"],
    ("docs/packing/bad-input.md", "Another pack is writing the same OUTPUT"): [
        "tests/test_publish.py::test_a_second_pack_to_the_same_output_fails_while_the_first_runs"],
    ("docs/packing/bad-input.md", "The disk (or the quota) fills up"): [
        "tests/test_publish.py::test_a_full_disk_is_one_error_and_keeps_the_old_dataset"],
    ("docs/packing/bad-input.md", "Each is refused before anything is opened or fetched"): [
        "tests/test_contained.py::test_every_hostile_name_is_refused_by_every_command"],
    ("docs/packing/bad-input.md", "Ctrl-C or `kill` during a pack"): [
        "tests/test_cli.py::test_interrupted_pack_keeps_its_state_for_resume",
        "tests/test_pack_resume.py::test_ctrl_c_keeps_the_pieces_and_says_how_to_resume"],
    # docs/jobs.md
    ("docs/jobs.md", "A piece that kills every worker it runs on stops the job"): [
        "tests/test_jobs.py::test_a_piece_that_kills_every_worker_stops_the_job_naming_it"],
    ("docs/jobs.md", "stops on an error a rerun would meet again"): [
        "tests/test_jobs.py::test_a_job_stopped_by_a_damaged_record_leaves_no_work_folder"],
    ("docs/packing/cluster.md", "stops with one `error:` line naming those that cannot"): [
        "tests/test_doc_promises.py::test_a_worker_without_fastdata_stops_the_pack_in_one_line"],
    ("docs/packing/cluster.md", "A worker that cannot see them fails"): [
        "tests/test_pack_cluster.py::test_workers_that_cannot_see_the_output_folder_fail_in_one_line"],
    ("docs/packing/cluster.md", "when the variable is not set"): [
        "tests/test_pack_cluster.py::test_cluster_pack_to_a_url_needs_a_shared_staging_folder"],
    ("docs/packing/cluster.md", "A piece that kills every worker it runs on"): [
        "tests/test_doc_promises.py::test_a_piece_that_kills_every_worker_stops_the_pack"],
    ("docs/packing/cluster.md", "A scheduler that does not answer"): [
        "tests/test_pack_cluster.py::test_cli_scheduler_that_does_not_answer_is_one_error_line"],
    ("docs/packing/index.md", "Errors raised by the library name options"): [
        "tests/test_cli.py::test_library_errors_speak_api_terms_and_the_cli_flags"],
    ("docs/packing/index.md", "It refuses, with one line naming what changed"): [
        "tests/test_pack_resume.py::test_resume_with_changed_options_is_refused_and_keeps_the_partial",
        "tests/test_pack_resume.py::test_resume_with_a_changed_source_is_refused"],
    ("docs/packing/index.md", "Interrupted during the final publish"): [
        "tests/test_pack_resume.py::test_killed_pack_resumes_to_identical_output",
        "tests/test_publish.py::test_a_full_disk_is_one_error_and_keeps_the_old_dataset"],
    ("docs/packing/index.md", "A pack that an earlier fastdata"): [
        "tests/test_doc_promises.py::test_an_interrupted_pack_of_the_earlier_layout_is_refused"],
    ("docs/packing/index.md", "a damaged one stops the conversion"): [
        "tests/test_convert.py::test_a_damaged_record_stops_the_conversion"],
    ("docs/packing/index.md", "one that fails, which only data from other tools can hold"): [
        "tests/test_hostile.py::test_dataset_refuses_a_bomb_in_a_foreign_tar"],
    ("docs/packing/index.md", "**Refused** with one `error:` line, nothing written"): [
        "tests/test_convert.py::test_cli_refuses_in_as_out",
        "tests/test_convert.py::test_cli_refuses_unreadable_input"],
    ("docs/packing/options.md", "An extension that names another format than `--format`"): [
        "tests/test_names.py::test_cli_refuses_an_extension_that_contradicts_format",
        "tests/test_names.py::test_python_refuses_an_extension_that_contradicts_format"],
    ("docs/packing/options.md", "One given for an output of another format is refused"): [
        "tests/test_interop.py::test_split_names_timm_cannot_look_up",
        "tests/test_contract.py::test_the_toy_format_s_writer_option_is_on_the_command_line"],
    ("docs/packing/sources.md", "absolute paths and `..` out of it are refused"): [
        "tests/test_sources.py::test_paths_out_of_the_list_folder_need_allow_outside"],
    ("docs/packing/sources.md", "names and integers mixed are refused"): [
        "tests/test_sources.py::test_bad_lists_are_refused_with_their_file_and_line_before_anything_is_written"],
    ("docs/packing/sources.md", "The list itself must be right"): [
        "tests/test_sources.py::test_bad_lists_are_refused_with_their_file_and_line_before_anything_is_written"],
    # docs/reading/
    ("docs/reading/augmentation.md", "a JPEG that cannot be cut or that TurboJPEG refuses"): [
        "tests/test_fused_crop.py::test_cmyk_and_png_take_the_full_decode"],
    ("docs/reading/index.md", "use one where code must fail on a file of another format"): [
        "tests/test_doc_promises.py::test_a_format_class_refuses_a_file_of_another_format"],
    ("docs/reading/index.md", "a record whose image header declares more pixels is refused"): [
        "tests/test_fused_crop.py::test_a_dataset_refuses_images_over_max_pixels_on_the_fused_path"],
    ("docs/reading/index.md", "a corrupt or undecodable record raises an error"): [
        "tests/test_skip.py::test_raise_stops_at_the_damaged_record"],
    ("docs/reading/index.md", "a name the format lacks is refused"): [
        "tests/test_one_api.py::test_reader_settings_go_to_the_formats_reader_by_name"],
    ("docs/reading/index.md", "lmdb refuses to open a path twice in a process"): [
        "tests/test_lmdb.py::test_two_datasets_on_one_path"],
    ("docs/reading/index.md", "too many open files"): [
        "tests/test_leaks.py::test_exhausted_descriptor_limit_is_not_corruption"],
    ("docs/reading/index.md", "DALI refuses the fields it does not have"): [
        "tests/test_dali.py::test_option_errors"],
    ("docs/reading/metadata.md", "a damaged one raises a `CorruptDataError`"): [
        "tests/test_metadata.py::test_damaged_metadata_is_reported"],
    ("docs/reading/mixing.md", "A state saved under other values is refused, naming the field"): [
        "tests/test_mix_resume.py::test_a_state_under_another_block_or_window_is_refused",
        "tests/test_dataset_ref.py::test_a_mixtures_state_records_each_sources_version"],
    ("docs/reading/mixing.md", "`Order(block=\"shard\")` is refused"): [
        "tests/test_mix_resume.py::test_whole_shards_as_blocks_are_refused_by_name_in_a_mixture"],
    ("docs/reading/mixing.md", "sources that cannot be combined as asked"): [
        "tests/test_mix.py::test_bad_mixtures_are_refused_before_any_batch"],
    ("docs/reading/streaming.md", "A state saved under another order or random crop"): [
        "tests/test_stream_resume.py::test_refuses_a_state_of_another_order",
        "tests/test_resume_descriptions.py::test_a_state_under_another_random_crop_is_refused"],
    ("docs/reading/training.md", "`load_state_dict` into the dataset refuses it"): [
        "tests/test_stream_resume.py::test_elastic_resume_needs_batch_size_with_several_workers"],
    ("docs/reading/training.md", "A state saved under other values is refused with the field"): [
        "tests/test_resume_descriptions.py::test_a_state_under_another_random_crop_is_refused",
        "tests/test_sampler.py::test_a_state_of_another_order_or_dataset_is_refused"],
    ("docs/reading/training.md", "computed each epoch's order as a whole permutation"): [
        "tests/test_order_scale.py::test_a_state_of_the_earlier_order_algorithm_is_refused"],
    ("docs/reading/training.md", "an error raised in the loop after the batches before it"): [
        "tests/test_background.py::test_an_error_reaches_the_loop_after_the_batches_before_it"],
    ("docs/reading/training.md", "a `StatefulDataLoader` is refused"): [
        "tests/test_background.py::test_a_loader_that_keeps_a_resume_state_is_refused"],
    # docs/reliability.md
    ("docs/reliability.md", "is refused when the manifest is read"): [
        "tests/test_contained.py::test_the_refusal_names_the_manifest_and_the_field"],
    ("docs/reliability.md", "`?` and `#` in a name are refused too"): [
        "tests/test_contained.py::test_query_and_fragment_characters_are_refused_at_urls_only"],
    ("docs/reliability.md", "that is a symbolic link to a place outside"): [
        "tests/test_contained.py::test_links_out_are_read_when_asked_for"],
    ("docs/reliability.md", "**Lists stay inside too.**"): [
        "tests/test_sources.py::test_paths_out_of_the_list_folder_need_allow_outside",
        "tests/test_pack_cluster.py::test_a_list_that_leads_outside_is_refused_before_any_task"],
    ("docs/reliability.md", "a redirect to another host is refused"): [
        "tests/test_contained.py::test_a_redirect_to_another_host_is_refused_and_never_asked"],
    ("docs/reliability.md", "more is cut off or refused, never buffered whole"): [
        "tests/test_contained.py::test_a_whole_read_past_its_limit_is_refused_unbuffered"],
    ("docs/reliability.md", "counts what was refused"): [
        "tests/test_contained.py::test_every_hostile_name_is_refused_by_every_command"],
    ("docs/reliability.md", "is refused even in datasets packed before those checksums"): [
        "tests/test_integrity.py::test_a_label_outside_the_classes_is_refused_without_checksums"],
    ("docs/reliability.md", "instead of returning an error"): [
        "tests/test_integrity.py::test_a_death_of_the_lmdb_library_is_an_error_naming_the_file",
        "tests/test_integrity.py::test_zeroed_lmdb_pages_give_an_error_never_an_abort"],
    ("docs/reliability.md", "every run must be refused with the field named"): [
        "tests/test_contained.py::test_every_hostile_name_is_refused_by_every_command"],
    ("docs/reliability.md", "every one refused with the field named"): [
        "tests/test_contained.py::test_every_hostile_name_is_refused_by_every_command"],
    # docs/remote/
    ("docs/remote/reading.md", "one line names the URL and what to do"): [
        "tests/test_storage.py::test_wrong_endpoint_fails_fast_with_one_line",
        "tests/test_storage.py::test_secrets_never_appear_in_error_text"],
    ("docs/remote/writing.md", "An existing dataset at the URL is refused unless"): [
        "tests/test_remote.py::test_pack_straight_to_s3_gives_the_local_records"],
    # docs/scale.md
    ("docs/scale.md", "made each epoch's order as a whole permutation is refused"): [
        "tests/test_order_scale.py::test_a_state_of_the_earlier_order_algorithm_is_refused"],
    ("docs/scale.md", "A piece whose CRC-32 fails in the copy"): [
        "tests/test_ranged_copy.py::test_a_header_damaged_at_the_url_is_fetched_twice_then_refused"],
    ("docs/scale.md", "A damaged piece of the index is refused"): [
        "tests/test_index_pieces.py::test_a_damaged_piece_is_refused_where_it_is_and_the_rest_reads"],
    # docs/speed/
    ("docs/speed/bench.md", "a row that does not is marked failed"): [
        "tests/test_bench.py::test_row_with_wrong_output_is_marked_failed"],
    ("docs/speed/dali.md", "DALI refuses the `Decode` fields it"): [
        "tests/test_dali.py::test_option_errors"],
    ("docs/speed/dali.md", "(an error with `reader=\"dali\"`)"): [
        "tests/test_dali_remote.py::test_cache_smaller_than_the_dataset"],
    ("docs/speed/dali.md", "Without DALI installed, building a pipeline raises"): [
        "tests/test_dali.py::test_clear_error_without_dali"],
    ("docs/speed/index.md", "whenever a faster decoder refuses an image"): [
        "tests/test_decode.py::test_decoders_agree_with_pillow"],
    ("docs/speed/index.md", "asking for it by name is an error saying why"): [
        "tests/test_decode.py::test_missing_decoder_names_the_package"],
    ("docs/speed/index.md", "is refused with a `DecodeError` naming its size"): [
        "tests/test_hostile.py::test_jpeg_bomb_refused_by_every_decoder"],
    ("docs/speed/index.md", "is where Pillow raises `DecompressionBombError`"): [
        "tests/test_hostile.py::test_jpeg_bomb_refused_by_every_decoder",
        "tests/test_hostile.py::test_png_bomb_refused_by_every_decoder"],
    ("docs/speed/index.md", "images declaring more pixels are refused (read) or skipped"): [
        "tests/test_fused_crop.py::test_a_dataset_refuses_images_over_max_pixels_on_the_fused_path",
        "tests/test_cli.py::test_max_pixels_flag_skips_images_over_the_limit"],
    ("docs/speed/index.md", "Refused with `--encoding png`/`raw`"): [
        "tests/test_jpeg_restarts.py::test_png_encoding_refuses_restarts"],
    ("docs/speed/index.md", "a shortfall is refused with both numbers"): [
        "tests/test_cache_prefetch.py::test_memory_check_refuses_with_needed_and_available"],
    # docs/tasks/
    ("docs/tasks/check-a-dataset.md", "exits with status 1 when there is any"): [
        "tests/test_cli.py::test_verify_damaged"],
    ("docs/tasks/find-duplicates-and-leaks.md", "`--fail-on-shared` exits with status 1"): [
        "tests/test_dedup.py::test_against_finds_every_shared_record_and_fails_on_request"],
    ("docs/tasks/resume-after-preemption.md", "**Another order is refused.**"): [
        "tests/test_sampler.py::test_a_state_of_another_order_or_dataset_is_refused",
        "tests/test_resume_descriptions.py::test_a_state_under_another_random_crop_is_refused",
        "tests/test_versions.py::test_map_style_resume_is_refused_on_another_version"],
}

# (page, a phrase of the sentence) -> why it promises nothing of fastdata's.
NOT_PROMISES: dict[tuple[str, str], str] = {
    ("docs/changing.md", "one failed `open`"):
        "a cost: how a dataset that never changed is told apart (no refusal)",
    ("docs/development/tests.md", "`.ci/run` installs what a fresh machine lacks"):
        "the CI script's own install steps",
    ("docs/development/tests.md", "CI fails on it in seconds"):
        "the test suite's rule for itself",
    ("docs/examples.md", "or stops with an error and changes nothing"): "pip's behaviour",
    ("docs/examples.md", "(they refuse uint8 tensors)"): "timm's transforms",
    ("docs/formats/interop.md", "webdataset's `to_tuple(\"jpg\", ...)` fails"):
        "webdataset's and timm's behaviour with other member names",
    ("docs/formats/interop.md", "are refused by timm's `Normalize`"): "timm's behaviour",
    ("docs/formats/interop.md", "a pack of JPEGs and PNGs together fails there"):
        "Hugging Face datasets' behaviour",
    ("docs/reading/metadata.md", "torch's default collate would try"): "torch's behaviour",
    ("docs/reliability.md", "`--json FILE` writes them with the failing trials"):
        "the fuzz harness's options: 'failing' names trials, no refusal",
    ("docs/speed/bench.md", "mosaicml-streaming 0.13.0 asks for"):
        "installing another library",
}


def _plain(text: str) -> str:
    """A sentence as the tables quote it: links reduced to their text, one space."""
    return " ".join(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).split())


def promises():
    """(page, line, sentence) of every sentence that promises a refusal or an error:
    in prose paragraphs, list items and table rows of the README and docs/
    (the generated reference pages aside)."""
    for page in pages():
        name = page.relative_to(ROOT).as_posix()
        if name.startswith("docs/reference/"):
            continue
        text = page.read_text(encoding="utf-8")
        items = [(n, t) for n, kind, t in units(text) if kind == "prose"]
        items += [(n, line) for n, line in enumerate(text.splitlines(), 1)
                  if line.lstrip().startswith("|")]
        for n, item in sorted(items):
            for sentence in re.split(r"(?<=[.;!?])\s+(?=[A-Z(`*\[])", item):
                if PROMISE.search(sentence):
                    yield name, n, _plain(sentence)


def _test_exists(name: str) -> bool:
    path, _, function = name.partition("::")
    file = ROOT / path
    return file.is_file() and re.search(rf"^(?:async )?def {re.escape(function)}\(",
                                        file.read_text(encoding="utf-8"), re.M) is not None


def test_every_promise_names_a_test():
    found = list(promises())
    assert len(found) >= 80, len(found)
    entries = {**{k: None for k in PROMISES}, **{k: None for k in NOT_PROMISES}}
    uncovered = [f"{page}:{n}: {sentence}" for page, n, sentence in found
                 if not any(p == page and phrase in sentence for p, phrase in entries)]
    assert not uncovered, ("sentences that promise a refusal or an error with no test in "
                           "tests/test_doc_promises.py's PROMISES (name the test that shows "
                           "it, or write one):\n" + "\n".join(uncovered))


def test_every_entry_still_quotes_its_page():
    found = list(promises())
    stale = [f"{page}: {phrase!r}" for page, phrase in [*PROMISES, *NOT_PROMISES]
             if not any(p == page and phrase in s for p, _, s in found)]
    assert not stale, "entries whose phrase no sentence of the page holds now:\n" + \
        "\n".join(stale)


def test_every_named_test_exists():
    missing = sorted({t for tests in PROMISES.values() for t in tests if not _test_exists(t)})
    assert not missing, f"tests named in PROMISES that do not exist: {missing}"
    assert all(PROMISES.values()), "a promise with an empty list of tests"


def test_the_scan_sees_sentences_of_prose_lists_and_tables(tmp_path):
    assert PROMISE.search("OUTPUT exists: refused unless --overwrite")
    assert PROMISE.search("it exits with status 1 when ...")
    assert not PROMISE.search("it returns the rest")
    assert _plain("a [view](concepts.md#view) is  refused") == "a view is refused"


# -- promises that had no test of their own ---------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """40 images in 4 classes, packed to LMDB and to tar shards of 10."""
    from conftest import build_tree, uniform_spec

    import fastdata

    root = tmp_path_factory.mktemp("promises")
    tree = build_tree(root / "images", uniform_spec(("a", "b", "c", "d"), 10), size=(8, 8))
    lmdb = fastdata.pack(tree.root, root / "d.lmdb", progress=False).output
    tar = fastdata.pack(tree.root, root / "d-%06d.tar",
                        options=fastdata.PackOptions(shard_size=10), progress=False).output
    return {"root": root, "tree": tree, "lmdb": lmdb, "tar": tar}


def test_a_state_resumes_at_its_position_under_another_batch_size_and_ranks(small):
    """docs/reading/training.md, "Resuming in another layout": saved after every
    one of W ranks took t batches of B, the state is W x t x B samples of the
    order; loaded under another batch size and rank count, the rest of the
    epoch is the order from there, cut anew."""
    import fastdata
    from fastdata import EpochBatches, Order

    ds = fastdata.open_dataset(small["lmdb"])
    n = len(ds)
    whole = [i for b in EpochBatches(ds, Order(shuffle=True, seed=3, batch_size=4)) for i in b]
    assert sorted(whole) == list(range(n))
    ranks = [EpochBatches(ds, Order(shuffle=True, seed=3, batch_size=4, rank=r, world_size=2))
             for r in range(2)]
    iters = [iter(s) for s in ranks]
    taken = []
    for _ in range(3):                      # t = 3 rounds: rank 0's batch, then rank 1's
        for it in iters:
            taken += next(it)
    state = ranks[0].state_dict()
    assert state["consumed"] == 2 * 3 * 4 == len(taken)
    assert taken == whole[:24]
    # Resumed on 3 ranks in batches of 5: the rest of the order, dealt anew.
    later = [EpochBatches(ds, Order(shuffle=True, seed=3, batch_size=5, rank=r, world_size=3))
             for r in range(3)]
    for s in later:
        s.load_state_dict(json.loads(json.dumps(state)))
    rounds = list(zip(*[list(s) for s in later]))
    rest = [i for batches in rounds for b in batches for i in b]
    assert len({len(list(s)) for s in later}) == 1            # equal batches on every rank
    assert rest[:n - 24] == whole[24:]                        # the order from the state on
    assert set(rest[n - 24:]) <= set(whole[24:])              # padding: repeats of the rest


def test_a_stream_resumes_at_its_position_under_another_batch_size(small):
    import fastdata
    import torch

    def run(batch, state=None, stop=None):
        ds = fastdata.open_dataset(small["tar"], streaming=True,
                                   decode=fastdata.Decode(output="tensor"),
                                   order=fastdata.Order(shuffle=True, seed=5, batch_size=batch))
        loader = fastdata.loader(ds, num_workers=0, device="cpu")
        if state is not None:
            loader.load_state_dict(state)
        got = []
        for step, (images, labels) in enumerate(loader):
            got.append(images.reshape(len(images), -1))
            if step + 1 == stop:
                return got, loader.state_dict()
        return got, None

    whole, _ = run(4)
    first, state = run(4, stop=3)
    assert state["consumed"] == 12
    rest, _ = run(6, state=state)
    assert torch.equal(torch.cat(first + rest), torch.cat(whole))


def test_a_streams_len_is_this_ranks_share(small):
    """docs/tasks/train-on-gpus-from-s3.md: a stream's len is already one rank's
    samples, so len(loader) is len(ds) // batch_size, the same on every rank."""
    import fastdata

    for world in (1, 3):
        sizes = []
        for rank in range(world):
            order = fastdata.Order(shuffle=True, seed=0, batch_size=4, drop_last=True,
                                   rank=rank, world_size=world)
            ds = fastdata.open_dataset(small["tar"], streaming=True, order=order)
            loader = fastdata.loader(ds, num_workers=0, device="cpu")
            assert len(ds) == 40 // world // 4 * 4
            assert len(loader) == len(ds) // 4 == sum(1 for _ in loader)
            sizes.append(len(loader))
        assert len(set(sizes)) == 1


def test_a_label_join_that_lost_a_race_is_refused(small, tmp_path):
    """docs/changing.md: a join with --label-column is refused if the dataset's
    labels changed since it read them (another label join landed first)."""
    import shutil

    import fastdata
    from fastdata.dataset import history
    from fastdata.dataset.commit import Conflict

    ds = shutil.copytree(Path(small["lmdb"]), tmp_path / "d.lmdb")
    keys = fastdata.open_reader(str(ds)).keys
    table = tmp_path / "fixed.jsonl"
    table.write_text("".join(json.dumps({"path": k, "fixed": "z"}) + "\n" for k in keys[:5]))
    fastdata.join(str(ds), table, key="path", label_column="fixed")      # version 2
    # A join that read version 1's labels, committing after version 2 landed:
    with pytest.raises(Conflict, match="changed since this join read its labels"):
        fastdata.join(history.record_path(str(ds), 1), table, key="path",
                      label_column="fixed")
    assert history.head_number(str(ds)) == 2


def test_an_interrupted_pack_of_the_earlier_layout_is_refused(small, tmp_path):
    """docs/packing/index.md: a state folder without the plan's entries file (as
    an earlier fastdata left it) is refused by --resume, saying to pack again."""
    from test_pack_resume import _killed_pack

    import fastdata
    from fastdata.errors import FastDataError
    from fastdata.packers.journal import ENTRIES_FILE

    out = tmp_path / "d-%06d.tar"
    _killed_pack(small["tree"].root, out, "between-shards", 2)
    entries = list(tmp_path.glob(f".*pack-state*/{ENTRIES_FILE}"))
    assert len(entries) == 1, list(tmp_path.iterdir())
    entries[0].unlink()
    with pytest.raises(FastDataError, match="pack again without --resume"):
        fastdata.pack(small["tree"].root, out, progress=False,
                      options=fastdata.PackOptions(shard_size=4, workers=1, resume=True))
    # Without --resume the same pack starts over and completes.
    done = fastdata.pack(small["tree"].root, out, progress=False,
                         options=fastdata.PackOptions(shard_size=4, workers=1))
    assert len(fastdata.open_dataset(done.output)) == 40


def test_a_format_class_refuses_a_file_of_another_format(small):
    """docs/reading/index.md: LMDBDataset, HDF5Dataset, TFRecordDataset and
    TarDataset pin the format: one opened on another format's file fails."""
    import fastdata
    from fastdata.errors import FastDataError

    with pytest.raises(FastDataError, match="a tar dataset, not lmdb"):
        fastdata.LMDBDataset(small["tar"])
    with pytest.raises(FastDataError, match="not tar"):
        fastdata.TarDataset(small["lmdb"])
    assert len(fastdata.TarDataset(small["tar"])) == 40


# -- a Dask cluster that cannot run fastdata's pieces -----------------------------------

#: Worker preloads (files a Dask worker process runs as it starts).
_NO_FASTDATA = "import sys\nsys.modules['fastdata'] = None   # as if not installed\n"
_DIES = """import os
import fastdata.packers.cluster_tasks as tasks
def _die(*args, **kwargs):
    os._exit(1)   # the worker process dies running the piece, as on an OOM kill
tasks.pack_shard_piece = tasks.prepare_piece = _die
"""


def _cluster_pack(tmp_path, preload: str, tree) -> str:
    """The one-line error of a tar pack on a cluster of one worker running ``preload``."""
    import optional

    # distributed makes every exception pickle through tblib (copyreg), which
    # other tests' restricted unpicklers refuse: the table is put back after.
    saved = dict(copyreg.dispatch_table)
    try:
        return _pack_on(optional.require("distributed"), tmp_path, preload, tree)
    finally:
        copyreg.dispatch_table.clear()
        copyreg.dispatch_table.update(saved)


def _pack_on(dd, tmp_path, preload: str, tree) -> str:
    import dask

    import fastdata
    from fastdata.errors import FastDataError

    script = tmp_path / "preload.py"
    script.write_text(preload)
    # One try per piece: a worker that dies running it is not given a second.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            dd.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                            host="127.0.0.1", dashboard_address=":0",
                            preload=[str(script)]) as cluster:
        with pytest.raises(FastDataError) as refused:
            fastdata.pack(tree.root, tmp_path / "out-%06d.tar", progress=False,
                          options=fastdata.PackOptions(shard_size=10),
                          scheduler=cluster.scheduler_address)
    message = str(refused.value)
    assert "\n" not in message.strip(), message
    assert not list(tmp_path.glob("out*.fastdata.json"))      # nothing published
    return message


def test_a_worker_without_fastdata_stops_the_pack_in_one_line(small, tmp_path):
    """docs/packing/cluster.md: a worker that lacks fastdata would die on the
    first piece it is given (Dask unpickles the task as it arrives): the pack
    asks the workers first and stops with one error line naming them."""
    message = _cluster_pack(tmp_path, _NO_FASTDATA, small["tree"])
    assert re.match(r"the Dask worker\(s\) at tcp://127\.0\.0\.1:\d+ cannot import "
                    r"fastdata, so they die unpacking its tasks: install fastdata", message), \
        message  # asked before any piece is sent


def test_a_piece_that_kills_every_worker_stops_the_pack(small, tmp_path):
    """docs/packing/cluster.md: a piece that kills every worker it runs on stops
    the pack with an error naming it."""
    message = _cluster_pack(tmp_path, _DIES, small["tree"])
    assert re.search(r"piece \d+: every Dask worker that ran it died", message), message
