/* metrics.jsonl reader (src/io/runlog.c): picks the records with both keys (and the kind asked
 * for), skips blank lines, refuses a malformed line naming file and line. */
#include <criterion/criterion.h>
#include <string.h>

#include "specmoe/io/runlog.h"

Test(runlog, reads_matching_records) {
    const char *t = "{\"global_step\": 10, \"episodic_return\": 3}\n"
                    "{\"global_step\": 20, \"losses/td_loss\": 0.5}\n\n"
                    "{\"global_step\": 30, \"episodic_return\": 5.5}\n"
                    "{\"kind\":\"train\",\"step\":4,\"loss\":2.0}\n{\"kind\":\"val\",\"step\":4,\"loss\":1.0}\n";
    sm_series s = {0};
    sm_error err = {0};
    cr_assert_eq(sm_runlog_parse(&s, t, strlen(t), "m.jsonl", "global_step", "episodic_return", NULL, &err), SM_OK);
    cr_assert_eq(s.n, 2);
    cr_assert_eq(s.x[1], 30);
    cr_assert_eq(s.y[1], 5.5);
    sm_series_free(&s);
    cr_assert_eq(sm_runlog_parse(&s, t, strlen(t), "m.jsonl", "step", "loss", "val", &err), SM_OK);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.y[0], 1.0);
    sm_series_free(&s);
}

Test(runlog, refuses_a_bad_line_with_its_number) {
    const char *t = "{\"global_step\": 1, \"episodic_return\": 1}\n{\"global_step\": 2,\n[1,2]\n";
    sm_series s = {0};
    sm_error err = {0};
    cr_assert_eq(sm_runlog_parse(&s, t, strlen(t), "run/metrics.jsonl", "global_step", "episodic_return", NULL, &err),
                 SM_ERR_FORMAT);
    cr_assert(strstr(err.msg, "run/metrics.jsonl:2:"), "%s", err.msg);
    sm_series_free(&s);
}
