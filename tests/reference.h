/* Shared by the tests that compare against PyTorch reference files (tests/data/ (.safetensors),
 * written by tools/reference/ (Python scripts) with __metadata__ magic "specmoe-reference", version "1"). */
#ifndef SPECMOE_TESTS_REFERENCE_H
#define SPECMOE_TESTS_REFERENCE_H

#include <criterion/criterion.h>
#include <string.h>

#include "specmoe/safetensors.h"

/* Opens path and checks its magic and version; script names the generator for the message. */
static inline void ref_open_file(sm_safetensors *st, const char *path, const char *script) {
    sm_error err = {{0}};
    sm_status s = sm_safetensors_load(st, path, &err);
    cr_assert_eq(s, SM_OK, "%s (run from the repo root; regenerate with /usr/bin/python3 %s)", err.msg, script);
    const char *magic = sm_safetensors_meta(st, "magic"), *version = sm_safetensors_meta(st, "version");
    cr_assert(magic && strcmp(magic, "specmoe-reference") == 0, "%s: bad magic '%s'", path, magic ? magic : "(none)");
    cr_assert(version && strcmp(version, "1") == 0, "%s: unsupported version '%s'", path, version ? version : "(none)");
}

#endif
