/* specmoe rl render CKPT --out episode.gif: one episode of a checkpoint's greedy policy as an
 * animated GIF. Environments that draw themselves (classic control) use their render function;
 * image observations (MinAtar) are drawn from their channels, one colour per channel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common.h"
#include "flags.h"
#include "specmoe/io/gif.h"
#include "specmoe/rl/agent.h"

/* A colour per observation channel (the later channel wins where several are set). */
static const uint8_t kChannel[10][3] = {{255, 255, 0}, {255, 0, 0},   {0, 255, 255}, {0, 128, 255}, {255, 0, 255},
                                        {0, 255, 0},   {255, 128, 0}, {128, 128, 255}, {255, 255, 255}, {160, 80, 0}};

static void draw_obs(const sm_env_spec *s, const float *obs, uint8_t *rgb, int H, int W) {
    const int C = s->obs_c, h = s->obs_h, w = s->obs_w;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            int cy = y * h / H, cx = x * w / W;
            uint8_t *p = rgb + 3 * ((size_t)y * W + x);
            p[0] = p[1] = p[2] = 24;
            for (int c = 0; c < C; c++)
                if (obs[(size_t)c * h * w + cy * w + cx] > 0.5f) memcpy(p, kChannel[c % 10], 3);
        }
}

int cmd_rl_render(int argc, char **argv) {
    struct {
        const char *out;
        long max_steps;
        uint64_t seed;
        int size, delay;
    } o;
    fl_flag fl[] = {
        {"out", FL_STRING, &o.out, "episode.gif", "the animated GIF to write", 0},
        {"max-steps", FL_LONG, &o.max_steps, "1000", "frames at most (an episode may be longer)", 0},
        {"seed", FL_U64, &o.seed, "1", "seed of the environment", 0},
        {"size", FL_INT, &o.size, "200", "picture width and height in pixels", 0},
        {"delay", FL_INT, &o.delay, "5", "hundredths of a second per frame", 0},
    };
    const char *pos[1];
    int npos;
    int rc = fl_parse(fl, (int)(sizeof fl / sizeof fl[0]), argc, argv, 3, "rl render", "CHECKPOINT [--out episode.gif]", pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : CLI_EXIT_USAGE;
    if (npos != 1) {
        fprintf(stderr, "specmoe rl render: give the checkpoint to render (a run's checkpoint.safetensors)\n");
        return CLI_EXIT_USAGE;
    }
    if (o.max_steps < 1 || o.max_steps > 1000000 || o.size < 16 || o.size > 2048 || o.delay < 1 || o.delay > 1000) {
        fprintf(stderr, "specmoe rl render: --max-steps in [1, 1e6], --size in [16, 2048] and --delay in [1, 1000] are needed\n");
        return CLI_EXIT_USAGE;
    }
    sm_error err = {0};
    const sm_agent_kind *k = sm_agent_of_checkpoint(pos[0], &err);
    if (!k) return cli_fail(SM_ERR_FORMAT, &err);
    cli_set_threads(1);
    sm_policy *p = k->load_policy(pos[0], 1, &err);
    if (!p) return cli_fail(err.code ? err.code : SM_ERR_FORMAT, &err);
    const sm_env_spec *s = p->env;
    if (!s->render && s->obs_h * s->obs_w == 1) {
        p->destroy(p);
        fprintf(stderr, "specmoe rl render: %s draws no picture and its observations are not an image\n", s->name);
        return CLI_EXIT_USAGE;
    }
    sm_vecenv v;
    sm_status st = sm_vecenv_init(&v, s->name, 1, o.seed, NULL, &err);
    if (st != SM_OK) {
        p->destroy(p);
        return cli_fail(st, &err);
    }
    const int D = sm_env_obs_numel(s), S = o.size;
    float *obs = calloc((size_t)D, sizeof(float)), *box = calloc((size_t)s->act_n, sizeof(float)), rew = 0;
    uint8_t *rgb = malloc((size_t)S * S * 3), *px = malloc((size_t)S * S), pal[768];
    int act = 0;
    unsigned char term = 0, trunc = 0;
    sm_gif g;
    memset(&g, 0, sizeof g);
    if (!obs || !box || !rgb || !px) st = sm_fail(&err, SM_ERR_NOMEM, "out of memory");
    sm_gif_palette_rgb(pal);
    if (st == SM_OK) st = sm_gif_open(&g, o.out, S, S, pal, o.delay, &err);
    long frames = 0;
    double ret = 0;
    if (st == SM_OK) {
        sm_vecenv_bind(&v, obs, &act, box, &rew, &term, &trunc, NULL);
        sm_vecenv_reset(&v);
        for (; frames < o.max_steps && st == SM_OK; frames++) {
            if (s->render) s->render(v.states, rgb, S, S);
            else draw_obs(s, obs, rgb, S, S);
            for (int i = 0; i < S * S; i++) px[i] = sm_gif_rgb_index(rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2]);
            st = sm_gif_frame(&g, px, &err);
            if (st != SM_OK) break;
            p->act(p, obs, 1, &act, box);
            sm_vecenv_step(&v);
            ret += rew;
            if (term || trunc) {
                frames++;
                break;
            }
        }
    }
    if (st == SM_OK) st = sm_gif_close(&g, &err);
    else sm_gif_abort(&g);
    free(obs);
    free(box);
    free(rgb);
    free(px);
    sm_vecenv_free(&v);
    p->destroy(p);
    if (st != SM_OK) return cli_fail(st, &err);
    printf("rl-render env=%s frames=%ld return=%.3f%s out=%s\n", s->name, frames, ret,
           term || trunc ? "" : " (episode cut at --max-steps)", o.out);
    return 0;
}
