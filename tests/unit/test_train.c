// test_train.c: the training loop and `gemc train`. The first half drives the Trainer on a
// micro model (resume is bit-exact, training lowers the held-out loss); the second runs the
// built gemc (BUILD/gemc, next to this test's directory) for the report, checkpoints through
// the command line, data files and every bad flag.
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "load_model.h"
#include "progress.h"
#include "train.h"

// Every kind of input, a causal self-attention, a PMA, both table optimizers' users and AdamW.
static const char micro_model[] =
    "model micro {\n"
    "  batch 16;\n"
    "  dim 8;\n"
    "  precision fp32;\n"
    "  optim adamw(lr = 0.01);\n"
    "  seq    history  : id max 12;\n"
    "  sparse ad       : id;\n"
    "  dense  counters : f32[3];\n"
    "  label  click;\n"
    "  table items : rows 50, optim rowwise_adagrad(lr = 0.1);\n"
    "  table ads   : rows 20;\n"
    "  h = embed(items, history);\n"
    "  h = h + gdpa(rmsnorm(h), heads = 2, act = silu, mask = causal);\n"
    "  p = pma(h, seeds = 2, heads = 2, act = silu);\n"
    "  a = embed(ads, ad);\n"
    "  c = linear(counters, 8);\n"
    "  z = concat(flatten(p), a, c);\n"
    "  y = mlp(z, [16, 1], act = relu);\n"
    "  loss bce(y, click);\n"
    "}\n";

// The same inputs with other shapes (dim 16): its checkpoints must not load into micro.
static const char wider_model[] =
    "model micro {\n"
    "  batch 16;\n"
    "  dim 16;\n"
    "  seq    history  : id max 12;\n"
    "  sparse ad       : id;\n"
    "  dense  counters : f32[3];\n"
    "  label  click;\n"
    "  table items : rows 50;\n"
    "  table ads   : rows 20;\n"
    "  h = embed(items, history);\n"
    "  a = embed(ads, ad);\n"
    "  c = linear(counters, 16);\n"
    "  y = mlp(concat(embed(items, history, pool = sum), a, c), [8, 1], act = relu);\n"
    "  loss bce(y, click);\n"
    "}\n";

static char tmp_dir[] = "/tmp/gemc_test_train_XXXXXX";
static char gemc_path[PATH_MAX];

static const char *tmp_path(const char *name) {
  static char buf[4][PATH_MAX + 64];
  static int next;
  char *p = buf[next++ % 4];
  snprintf(p, sizeof buf[0], "%s/%s", tmp_dir, name);
  return p;
}

static void write_text(const char *name, const char *text) {
  FILE *f = fopen(tmp_path(name), "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  char *buf = malloc((size_t)n + 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  buf[got] = '\0';
  fclose(f);
  return buf;
}

// --- the Trainer, in process ------------------------------------------------------------

typedef struct Session {
  LoadedModel m;
  Trainer *t;
} Session;

static void session_open(Session *s, const char *model_file, uint64_t seed) {
  assert_true(load_model(&s->m, tmp_path(model_file), NULL, true, true, false));
  TrainOptions o;
  train_options_default(&o);
  o.seed = seed;
  o.eval_examples = 64;
  char err[512] = "";
  s->t = trainer_new(&s->m.ir, &o, err, sizeof err);
  if (!s->t) fail_msg("trainer_new: %s", err);
}

static void session_close(Session *s) {
  trainer_free(s->t);
  loaded_model_free(&s->m);
}

static double step_ok(Trainer *t) {
  double loss = NAN;
  char err[512] = "";
  if (!trainer_step(t, &loss, err, sizeof err)) fail_msg("trainer_step: %s", err);
  return loss;
}

static double eval_loss(Trainer *t) {
  EvalResult r;
  char err[512] = "";
  if (!trainer_eval(t, &r, err, sizeof err)) fail_msg("trainer_eval: %s", err);
  return r.loss;
}

// N steps, a checkpoint, a fresh process-like restart from it and N more steps give the same
// losses, parameters and optimizer state, to the last bit, as 2N straight steps. The straight
// run also evaluates in between, which must not disturb it.
static void test_train_resume_is_bit_exact(void **state) {
  (void)state;
  enum { N = 5 };
  Session straight, first, second;
  session_open(&straight, "micro.gem", 7);
  double want[2 * N];
  for (int i = 0; i < 2 * N; i++) {
    want[i] = step_ok(straight.t);
    if (i == 2 || i == N) eval_loss(straight.t);
  }
  char err[512] = "";
  assert_true(trainer_save(straight.t, tmp_path("ck_straight"), err, sizeof err));

  session_open(&first, "micro.gem", 7);
  for (int i = 0; i < N; i++) assert_true(step_ok(first.t) == want[i]);
  assert_true(trainer_save(first.t, tmp_path("ck_half"), err, sizeof err));
  session_close(&first);

  session_open(&second, "micro.gem", 7);
  if (!trainer_resume(second.t, tmp_path("ck_half"), err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(trainer_step_count(second.t), N);
  for (int i = N; i < 2 * N; i++) {
    double got = step_ok(second.t);
    if (memcmp(&got, &want[i], sizeof got) != 0)
      fail_msg("step %d: resumed loss %.17g, straight %.17g", i + 1, got, want[i]);
  }
  assert_memory_equal(trainer_losses(second.t), want, sizeof want);
  assert_true(trainer_save(second.t, tmp_path("ck_resumed"), err, sizeof err));
  session_close(&second);
  session_close(&straight);

  // The whole state, parameters and optimizer moments included, is byte for byte the same.
  char a[PATH_MAX + 64], b[PATH_MAX + 64];
  snprintf(a, sizeof a, "%s/%s", tmp_path("ck_straight"), CHECKPOINT_FILE);
  snprintf(b, sizeof b, "%s/%s", tmp_path("ck_resumed"), CHECKPOINT_FILE);
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  assert_non_null(fa);
  assert_non_null(fb);
  int ca, cb;
  long at = 0;
  do {
    ca = fgetc(fa);
    cb = fgetc(fb);
    if (ca != cb) fail_msg("checkpoints differ at byte %ld", at);
    at++;
  } while (ca != EOF);
  fclose(fa);
  fclose(fb);
}

static void test_train_resume_refuses_another_model(void **state) {
  (void)state;
  Session s, other;
  session_open(&s, "micro.gem", 1);
  step_ok(s.t);
  char err[512] = "";
  assert_true(trainer_save(s.t, tmp_path("ck_micro"), err, sizeof err));
  session_close(&s);

  session_open(&other, "wider.gem", 1);
  assert_false(trainer_resume(other.t, tmp_path("ck_micro"), err, sizeof err));
  assert_non_null(strstr(err, "was written for model 'micro' with other shapes"));
  assert_non_null(strstr(err, "ck_micro/checkpoint.gemc"));
  assert_int_equal(trainer_step_count(other.t), 0);
  session_close(&other);
}

// The GPU compiles the optimizers' hyper-parameters into its kernels: an override with an
// artifact (compiled with the model's values) is refused with the reason, before any GPU use.
static void test_train_overrides_with_an_artifact_are_refused(void **state) {
  (void)state;
  LoadedModel m;
  assert_true(load_model(&m, tmp_path("micro.gem"), NULL, true, true, false));
  TrainOptions o;
  train_options_default(&o);
  o.cuda = true;
  o.artifact = tmp_path("micro.gemb");
  o.optim.lr = 0.01;
  char err[512] = "";
  Trainer *t = trainer_new(&m.ir, &o, err, sizeof err);
  assert_null(t);
  assert_non_null(strstr(err, "optimizer overrides (--lr, --table-lr, ...) cannot change an artifact"));
  loaded_model_free(&m);
}

// A short run on synthetic data lowers the held-out loss, and the training loss falls.
static void test_train_short_run_lowers_the_loss(void **state) {
  (void)state;
  enum { STEPS = 150 };
  Session s;
  session_open(&s, "micro.gem", 3);
  double before = eval_loss(s.t);
  double early = 0, late = 0;
  for (int i = 0; i < STEPS; i++) {
    double l = step_ok(s.t);
    if (i < 20) early += l;
    if (i >= STEPS - 20) late += l;
  }
  double after = eval_loss(s.t);
  if (!(after < before && late < early))
    fail_msg("eval loss %.4f -> %.4f, train loss %.4f -> %.4f", before, after, early / 20,
             late / 20);
  session_close(&s);
}

// --- progress output --------------------------------------------------------------------

static int count_char(const char *s, char c) {
  int n = 0;
  for (; *s; s++) n += *s == c;
  return n;
}

// Not on a terminal: a plain line every tenth of the run, none where a result line was just
// printed; result lines go to the other stream. On a terminal: one line redrawn with \r, and
// erased before a result line.
static void test_train_progress_plain_and_live(void **state) {
  (void)state;
  char *out_text = NULL, *err_text = NULL;
  size_t out_size = 0, err_size = 0;
  FILE *out = open_memstream(&out_text, &out_size), *err = open_memstream(&err_text, &err_size);
  Progress p;
  progress_begin(&p, out, err, false, 0, 100, 20);  // resumed at step 100, 20 more
  for (int64_t s = 101; s <= 120; s++) {
    bool row = s == 110;
    if (row) progress_line(&p, "row %d", (int)s);
    progress_step(&p, s, 0.5, 0.9, 1000, row);
  }
  progress_end(&p);
  fclose(out);
  fclose(err);
  assert_string_equal(out_text, "row 110\n");
  assert_int_equal(count_char(err_text, '\n'), 9);  // steps 102, 104, ..., 120 but not 110
  assert_int_equal(count_char(err_text, '\r'), 0);
  assert_non_null(strstr(err_text, "step 102/120 ( 10%)  loss 0.5000  NE 0.9000  1000 ex/s"));
  assert_non_null(strstr(err_text, "step 120/120 (100%)"));
  assert_null(strstr(err_text, "step 110/120"));
  free(out_text);
  free(err_text);

  out = open_memstream(&out_text, &out_size);
  err = open_memstream(&err_text, &err_size);
  progress_begin(&p, out, err, false, 1, 0, 3);
  progress_step(&p, 1, 0.5, 0.9, 1000, false);
  progress_line(&p, "row");
  progress_step(&p, 3, 0.5, 0.9, 1000, false);  // the last step is always drawn
  progress_end(&p);
  fclose(out);
  fclose(err);
  assert_string_equal(out_text, "row\n");
  assert_int_equal(count_char(err_text, '\n'), 0);
  assert_true(count_char(err_text, '\r') >= 4);  // draw, erase (2), draw, erase (2)
  assert_non_null(strstr(err_text, "step 3/3 (100%)"));
  free(out_text);
  free(err_text);

  // Quiet: nothing at all.
  out = open_memstream(&out_text, &out_size);
  err = open_memstream(&err_text, &err_size);
  progress_begin(&p, out, err, true, 0, 0, 2);
  progress_line(&p, "row");
  progress_step(&p, 2, 0.5, 0.9, 1000, false);
  progress_end(&p);
  fclose(out);
  fclose(err);
  assert_string_equal(out_text, "");
  assert_string_equal(err_text, "");
  free(out_text);
  free(err_text);

  char buf[32];
  progress_format_duration(65, buf, sizeof buf);
  assert_string_equal(buf, "1:05");
  progress_format_duration(7420, buf, sizeof buf);
  assert_string_equal(buf, "2:03:40");
  progress_format_duration(NAN, buf, sizeof buf);
  assert_string_equal(buf, "--");
}

// --- a small JSON checker ---------------------------------------------------------------

typedef struct Json {
  const char *p;
} Json;

static void json_space(Json *j) {
  while (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r') j->p++;
}

static bool json_value(Json *j, int depth);

static bool json_string_ok(Json *j) {
  if (*j->p != '"') return false;
  for (j->p++; *j->p != '"'; j->p++) {
    if (*j->p == '\0' || (unsigned char)*j->p < 0x20) return false;
    if (*j->p == '\\') {
      j->p++;
      if (*j->p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!strchr("0123456789abcdefABCDEF", j->p[i]) || !j->p[i]) return false;
        j->p += 4;
      } else if (!*j->p || !strchr("\"\\/bfnrt", *j->p)) {
        return false;
      }
    }
  }
  j->p++;
  return true;
}

static bool json_number_ok(Json *j) {
  const char *s = j->p;
  if (*j->p == '-') j->p++;
  if (*j->p == '0') j->p++;
  else if (*j->p >= '1' && *j->p <= '9') while (*j->p >= '0' && *j->p <= '9') j->p++;
  else return false;
  if (*j->p == '.') {
    j->p++;
    if (!(*j->p >= '0' && *j->p <= '9')) return false;
    while (*j->p >= '0' && *j->p <= '9') j->p++;
  }
  if (*j->p == 'e' || *j->p == 'E') {
    j->p++;
    if (*j->p == '+' || *j->p == '-') j->p++;
    if (!(*j->p >= '0' && *j->p <= '9')) return false;
    while (*j->p >= '0' && *j->p <= '9') j->p++;
  }
  return j->p > s;
}

static bool json_items(Json *j, char close, bool keyed, int depth) {
  j->p++;
  json_space(j);
  if (*j->p == close) {
    j->p++;
    return true;
  }
  for (;;) {
    json_space(j);
    if (keyed) {
      if (!json_string_ok(j)) return false;
      json_space(j);
      if (*j->p++ != ':') return false;
    }
    if (!json_value(j, depth + 1)) return false;
    json_space(j);
    if (*j->p == close) {
      j->p++;
      return true;
    }
    if (*j->p++ != ',') return false;
  }
}

static bool json_value(Json *j, int depth) {
  if (depth > 64) return false;
  json_space(j);
  switch (*j->p) {
  case '{': return json_items(j, '}', true, depth);
  case '[': return json_items(j, ']', false, depth);
  case '"': return json_string_ok(j);
  case 't': return strncmp(j->p, "true", 4) == 0 && (j->p += 4);
  case 'f': return strncmp(j->p, "false", 5) == 0 && (j->p += 5);
  case 'n': return strncmp(j->p, "null", 4) == 0 && (j->p += 4);
  default: return json_number_ok(j);
  }
}

static bool json_valid(const char *text) {
  Json j = {text};
  if (!json_value(&j, 0)) return false;
  json_space(&j);
  return *j.p == '\0';
}

static void test_train_json_checker_refuses_bad_json(void **state) {
  (void)state;
  assert_true(json_valid("{\"a\": [1, -2.5e3, null, true, \"x\\n\"], \"b\": {}}"));
  assert_false(json_valid("{\"a\": [1, 2,]}"));
  assert_false(json_valid("{\"a\": nan}"));
  assert_false(json_valid("{\"a\": 1} x"));
  assert_false(json_valid("{\"a\" 1}"));
  assert_false(json_valid("[01]"));
}

// The numbers of a JSON array that follows `"key": [`, as text.
static char *json_array_text(const char *json, const char *key) {
  char needle[64];
  snprintf(needle, sizeof needle, "\"%s\": [", key);
  const char *at = strstr(json, needle);
  if (!at) return NULL;
  at += strlen(needle);
  const char *end = strchr(at, ']');
  return end ? strndup(at, (size_t)(end - at)) : NULL;
}

static int count_numbers(const char *list) {
  int n = 0;
  for (const char *p = list; *p;) {
    char *end;
    strtod(p, &end);
    if (end == p) {
      p++;
      continue;
    }
    n++;
    p = end;
  }
  return n;
}

// --- gemc, run as a program -------------------------------------------------------------

typedef struct Run {
  int rc;
  char *out, *err;
} Run;

static Run run_gemc(const char *args) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >stdout.txt 2>stderr.txt", tmp_dir, gemc_path,
           args);
  int status = system(cmd);
  assert_true(WIFEXITED(status));
  Run r = {WEXITSTATUS(status), read_text(tmp_path("stdout.txt")),
           read_text(tmp_path("stderr.txt"))};
  return r;
}

static void run_free(Run *r) {
  free(r->out);
  free(r->err);
}

static void test_train_cli_report_is_valid_json(void **state) {
  (void)state;
  Run r = run_gemc("train micro.gem --steps 6 --eval-every 3 --eval-examples 32 "
                   "--report report.json --progress plain");
  if (r.rc != 0) fail_msg("rc %d: %s", r.rc, r.err);
  // The banner says which backend it chose, and why; the curve has a row per evaluation.
  assert_non_null(strstr(r.out, "backend  cpu (auto: "));
  assert_non_null(strstr(r.out, "eval NE"));
  assert_non_null(strstr(r.out, "throughput: "));
  assert_non_null(strstr(r.out, "examples/s"));
  char *json = read_text(tmp_path("report.json"));
  assert_non_null(json);
  if (!json_valid(json)) fail_msg("not valid JSON:\n%s", json);
  assert_non_null(strstr(json, "\"model\": \"micro\""));
  assert_non_null(strstr(json, "\"backend\": \"cpu\""));
  assert_non_null(strstr(json, "\"steps\": 6"));
  assert_non_null(strstr(json, "\"name\": \"click\""));
  assert_non_null(strstr(json, "\"examples_per_second\": "));
  char *losses = json_array_text(json, "loss");
  assert_non_null(losses);
  assert_int_equal(count_numbers(losses), 6);
  free(losses);
  free(json);
  run_free(&r);
}

// The same bit-exactness through the command line: 4 + 4 resumed steps log the same losses
// (17 significant digits) as 8 straight ones.
static void test_train_cli_resume_matches_a_straight_run(void **state) {
  (void)state;
  Run r = run_gemc("train micro.gem -q --steps 8 --eval-every 0 --eval-examples 16 "
                   "--report straight.json");
  assert_int_equal(r.rc, 0);
  run_free(&r);
  r = run_gemc("train micro.gem -q --steps 4 --eval-examples 16 --save ck_cli");
  assert_int_equal(r.rc, 0);
  assert_string_equal(r.out, "");  // -q: nothing but errors
  assert_string_equal(r.err, "");
  run_free(&r);
  r = run_gemc("train micro.gem -q --steps 4 --eval-every 0 --eval-examples 16 --resume ck_cli "
               "--report resumed.json");
  if (r.rc != 0) fail_msg("rc %d: %s", r.rc, r.err);
  run_free(&r);
  char *a = read_text(tmp_path("straight.json")), *b = read_text(tmp_path("resumed.json"));
  char *la = json_array_text(a, "loss"), *lb = json_array_text(b, "loss");
  assert_non_null(la);
  assert_non_null(lb);
  assert_int_equal(count_numbers(la), 8);
  assert_string_equal(la, lb);
  assert_non_null(strstr(b, "\"resumed_from_step\": 4"));
  free(la);
  free(lb);
  free(a);
  free(b);

  // A checkpoint of another model is refused, naming the file.
  r = run_gemc("train wider.gem --steps 1 --resume ck_cli");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "ck_cli/checkpoint.gemc was written for model 'micro'"));
  run_free(&r);
  // So is another seed than the checkpoint's.
  r = run_gemc("train micro.gem --steps 1 --seed 9 --resume ck_cli");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "--seed 9 differs from seed 1"));
  run_free(&r);
}

static void test_train_cli_bad_flags_are_usage_errors(void **state) {
  (void)state;
  static const struct {
    const char *args, *message;
  } cases[] = {
      {"train micro.gem --steps -1", "--steps must be a whole number in [0, 1000000000], got -1"},
      {"train micro.gem --steps abc", "--steps must be a whole number in [0, 1000000000], got abc"},
      {"train micro.gem --steps", "--steps needs a value"},
      {"train micro.gem --batch 0", "--batch must be a whole number in [1, 1048576], got 0"},
      {"train micro.gem --bogus", "unknown option '--bogus' for 'gemc train'"},
      {"train micro.gem --backend gpu", "--backend needs cpu, cuda or auto, got 'gpu'"},
      {"train micro.gem --save-every 5", "--save-every needs --save DIR"},
      {"train micro.gem --lr 0", "--lr must be in (0, 1e6], got 0"},
      {"train micro.gem --lr nan", "--lr must be in (0, 1e6], got nan"},
      {"train micro.gem --beta1 1", "--beta1 must be in [0, 1), got 1"},
      {"train micro.gem --lengths long", "--lengths needs uniform, lognormal or heavy"},
      {"train micro.gem --data x.gemd --lengths heavy", "--lengths only applies to synthetic"},
      {"train micro.gem --progress fancy", "--progress needs auto, live or plain"},
      {"train", "'gemc train' needs a model FILE"},
      {"train a.gem b.gem", "'gemc train' takes one FILE"},
      {"train micro.gem --seed -3",
       "--seed must be a whole number in [0, 18446744073709551615], got -3"},
      {"train micro.gem --report", "--report needs a file name"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Run r = run_gemc(cases[i].args);
    if (r.rc != 2 || !strstr(r.err, cases[i].message) || !strstr(r.err, "usage: gemc train"))
      fail_msg("gemc %s: rc %d, stderr:\n%s", cases[i].args, r.rc, r.err);
    run_free(&r);
  }
}

static void test_train_cli_cuda_backend_is_a_clear_error(void **state) {
  (void)state;
  Run r = run_gemc("train micro.gem --backend cuda --steps 1");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "--backend cuda: no usable GPU"));
  run_free(&r);
}

static void test_train_cli_data_file_round_trip(void **state) {
  (void)state;
  // 200 records whose label is 1 exactly when the ad id is odd.
  FILE *f = fopen(tmp_path("records.tsv"), "w");
  assert_non_null(f);
  fprintf(f, "history\tad\tcounters\tclick\n");
  for (int i = 0; i < 200; i++) {
    fprintf(f, "%d %d %d\t%d\t%d.5 1 -%d\t%d\n", i % 50, (i * 7) % 50, (i * 3) % 50, i % 20,
            i % 4, i % 3, (i % 20) % 2);
  }
  fclose(f);
  Run r = run_gemc("data convert micro.gem records.tsv -o records.gemd");
  if (r.rc != 0) fail_msg("convert: rc %d: %s", r.rc, r.err);
  assert_non_null(strstr(r.out, "200 examples"));
  run_free(&r);
  r = run_gemc("train micro.gem --data records.gemd --steps 12 --report data.json -q");
  if (r.rc != 0) fail_msg("train --data: rc %d: %s", r.rc, r.err);
  run_free(&r);
  char *json = read_text(tmp_path("data.json"));
  assert_true(json_valid(json));
  assert_non_null(strstr(json, "\"kind\": \"file\""));
  // The last tenth, in whole batches of 16, is held out: 16 examples; 184 train.
  assert_non_null(strstr(json, "\"train_examples\": 184"));
  assert_non_null(strstr(json, "\"eval_examples\": 16"));
  free(json);
  // A missing data file is an error that names it.
  r = run_gemc("train micro.gem --data missing.gemd --steps 1");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "missing.gemd"));
  run_free(&r);
}

// --- the divergence guard and the held-out set (issue 9) --------------------------------

static Run run_gemc_env(const char *env, const char *args) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "cd '%s' && %s '%s' %s >stdout.txt 2>stderr.txt", tmp_dir, env,
           gemc_path, args);
  int status = system(cmd);
  assert_true(WIFEXITED(status));
  Run r = {WEXITSTATUS(status), read_text(tmp_path("stdout.txt")),
           read_text(tmp_path("stderr.txt"))};
  return r;
}

// The JSON object after "KEY": up to its closing brace (no nested objects in the ones used).
static char *json_object_text(const char *json, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": {", key);
  const char *p = strstr(json, pat);
  if (!p) return NULL;
  const char *end = strstr(p, "}");
  return end ? strndup(p, (size_t)(end - p) + 1) : NULL;
}

// A learning rate that makes the parameters NaN stops the run with exit 1, naming the step,
// the tensor and what it holds; the checkpoint saved before is left byte for byte, a run that
// never saved leaves none, and the report is still written with the failure.
static void test_train_divergence_stops_and_keeps_the_checkpoint(void **state) {
  (void)state;
  Run r = run_gemc("train micro.gem -q --steps 4 --eval-examples 32 --save ck_div");
  if (r.rc != 0) fail_msg("rc %d: %s", r.rc, r.err);
  run_free(&r);
  char *before = read_text(tmp_path("ck_div/checkpoint.gemc"));
  assert_non_null(before);
  struct stat st0;
  assert_int_equal(stat(tmp_path("ck_div/checkpoint.gemc"), &st0), 0);

  r = run_gemc("train micro.gem -q --steps 40 --eval-every 2 --eval-examples 32 --lr 1e6 "
               "--resume ck_div --save ck_div --report div.json");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "gemc: error: training diverged: after step 6, "));
  assert_non_null(strstr(r.err, " NaN and "));
  assert_non_null(strstr(r.err, "try a lower --lr (this run's is 1e+06)"));
  run_free(&r);
  char *after = read_text(tmp_path("ck_div/checkpoint.gemc"));
  struct stat st1;
  assert_int_equal(stat(tmp_path("ck_div/checkpoint.gemc"), &st1), 0);
  assert_int_equal(st0.st_size, st1.st_size);
  assert_memory_equal(before, after, (size_t)st0.st_size);
  free(before);
  free(after);

  char *json = read_text(tmp_path("div.json"));
  assert_non_null(json);
  if (!json_valid(json)) fail_msg("not valid JSON:\n%s", json);
  char *f = json_object_text(json, "failure");
  assert_non_null(f);
  assert_non_null(strstr(f, "\"step\": 6"));
  assert_non_null(strstr(f, "\"tensor\": \""));
  assert_non_null(strstr(f, "\"what\": \""));
  assert_non_null(strstr(f, "\"message\": \"training diverged"));
  assert_non_null(strstr(json, "\"steps\": 6"));
  assert_non_null(strstr(json, "\"model\": \"micro\""));
  free(f);
  free(json);

  // Never saved: no checkpoint appears.
  r = run_gemc("train micro.gem -q --steps 40 --eval-every 2 --eval-examples 32 --lr 1e6 "
               "--save ck_div2");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "training diverged"));
  struct stat st2;
  assert_int_not_equal(stat(tmp_path("ck_div2/checkpoint.gemc"), &st2), 0);
  run_free(&r);

  // A save every step meets the guard first: "not saved", the old file left as it was.
  r = run_gemc("train micro.gem -q --steps 40 --eval-every 0 --eval-examples 32 --lr 1e6 "
               "--resume ck_div --save ck_div --save-every 1");
  assert_int_equal(r.rc, 1);
  if (!strstr(r.err, "not saved: the checkpoint in ck_div is left as it was") &&
      !strstr(r.err, "training diverged at step"))
    fail_msg("%s", r.err);
  run_free(&r);
}

// In process: --on-nan skip leaves the state of a skipped step as it was (the held-out loss
// after two skipped steps is the one before them, bit for bit), consumes its batch, and the
// N-th bad step in a row stops with the failure recorded.
static void test_train_on_nan_skip_in_process(void **state) {
  (void)state;
  LoadedModel m;
  assert_true(load_model(&m, tmp_path("micro.gem"), NULL, true, true, false));
  TrainOptions o;
  train_options_default(&o);
  o.eval_examples = 32;
  o.on_nan_skip = 3;
  o.test_nan_first = 3;
  o.test_nan_count = 2;
  char err[512] = "";
  Trainer *t = trainer_new(&m.ir, &o, err, sizeof err);
  if (!t) fail_msg("trainer_new: %s", err);
  step_ok(t);
  step_ok(t);
  assert_false(trainer_step_skipped(t));
  double before = eval_loss(t);
  assert_true(isnan(step_ok(t)));
  assert_true(trainer_step_skipped(t));
  assert_true(isnan(step_ok(t)));
  assert_int_equal(trainer_step_count(t), 4);
  assert_true(eval_loss(t) == before);
  assert_true(trainer_check_finite(t, err, sizeof err));
  assert_true(isfinite(step_ok(t)));
  assert_false(trainer_step_skipped(t));
  assert_false(trainer_failure(t)->failed);
  int64_t n = 0;
  const int64_t *skipped = trainer_skipped_steps(t, &n);
  assert_int_equal(n, 2);
  assert_int_equal(skipped[0], 3);
  assert_int_equal(skipped[1], 4);
  trainer_free(t);

  // Three in a row stop it at the third.
  o.test_nan_count = 5;
  t = trainer_new(&m.ir, &o, err, sizeof err);
  if (!t) fail_msg("trainer_new: %s", err);
  step_ok(t);
  step_ok(t);
  step_ok(t);
  step_ok(t);
  double loss;
  assert_false(trainer_step(t, &loss, err, sizeof err));
  assert_non_null(strstr(err, "training diverged at step 5: the loss is NaN (3 non-finite steps "
                              "in a row; --on-nan skip=3 stops there); try a lower --lr"));
  const TrainFailure *f = trainer_failure(t);
  assert_true(f->failed);
  assert_int_equal(f->step, 5);
  assert_string_equal(f->tensor, "loss");
  assert_string_equal(f->what, "NaN");
  assert_int_equal(f->skipped_in_row, 3);
  trainer_free(t);
  loaded_model_free(&m);
}

// The same through the command line: skipped steps are warned about and reported, the run
// goes on; N in a row exit 1; a bad --on-nan is a usage error; the default is stop.
static void test_train_cli_on_nan(void **state) {
  (void)state;
  Run r = run_gemc_env("GEMC_TEST_NAN_STEPS=3:2", "train micro.gem --steps 8 --eval-examples "
                       "32 --on-nan skip=3 --progress plain --report skip.json");
  if (r.rc != 0) fail_msg("rc %d: %s", r.rc, r.err);
  assert_non_null(strstr(r.err, "gemc: warning: step 3 skipped: its loss or a gradient is not "
                                "finite (--on-nan skip)"));
  assert_non_null(strstr(r.err, "step 4 skipped"));
  run_free(&r);
  char *json = read_text(tmp_path("skip.json"));
  assert_non_null(json);
  if (!json_valid(json)) fail_msg("not valid JSON:\n%s", json);
  assert_non_null(strstr(json, "\"failure\": null"));
  char *sk = json_array_text(json, "skipped_steps");
  assert_non_null(sk);
  assert_int_equal(count_numbers(sk), 2);
  free(sk);
  free(json);

  r = run_gemc_env("GEMC_TEST_NAN_STEPS=3:9", "train micro.gem -q --steps 8 --eval-examples 32 "
                   "--on-nan skip=3 --report skip3.json");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "training diverged at step 5: the loss is NaN (3 non-finite "
                                "steps in a row; --on-nan skip=3 stops there)"));
  run_free(&r);
  json = read_text(tmp_path("skip3.json"));
  assert_non_null(json);
  assert_non_null(strstr(json, "\"skipped_in_row\": 3"));
  free(json);

  // The default stops at the first one, before its update.
  r = run_gemc_env("GEMC_TEST_NAN_STEPS=2", "train micro.gem -q --steps 8 --eval-examples 32");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "gemc: error: training diverged at step 2: the loss is NaN; "
                                "try a lower --lr (this run's is 0.01)"));
  run_free(&r);
  // A real blow-up under skip: every step is bad, so N of them stop it.
  r = run_gemc("train micro.gem -q --steps 40 --eval-examples 32 --lr 1e6 --on-nan skip=2");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "training diverged"));
  run_free(&r);

  const char *bad[] = {"--on-nan", "--on-nan maybe", "--on-nan skip=0", "--on-nan skip=x",
                       "--on-nan=skip=-1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char args[128];
    snprintf(args, sizeof args, "train micro.gem --steps 1 %s", bad[i]);
    r = run_gemc(args);
    if (r.rc != 2) fail_msg("%s: rc %d", bad[i], r.rc);
    assert_non_null(strstr(r.err, "--on-nan"));
    run_free(&r);
  }
}

// A finite loss that explodes is a warning, once, and the run goes on.
static void test_train_exploding_loss_warns_once(void **state) {
  (void)state;
  Run r = run_gemc("train micro.gem --steps 60 --eval-every 2 --eval-examples 32 --lr 0.3 "
                   "--table-lr 1 --progress plain --report explode.json");
  if (r.rc != 0) fail_msg("rc %d: %s", r.rc, r.err);
  const char *w = strstr(r.err, "gemc: warning: the ");
  assert_non_null(w);
  assert_non_null(strstr(w, "over 100 times the first evaluation's"));
  assert_non_null(strstr(w, "try a lower --lr (this run's is 0.3)"));
  assert_null(strstr(w + 1, "gemc: warning: the "));
  run_free(&r);
  char *json = read_text(tmp_path("explode.json"));
  assert_non_null(json);
  assert_non_null(strstr(json, "\"loss_warning\": \"the "));
  free(json);
}

// The default held-out set does not follow --steps: 5 steps and 5 resumed evaluate on the set
// 10 straight steps do, with the same final numbers; and --steps 0 with --resume and --save
// adds no curve row, however often it runs.
static void test_train_resume_evaluates_like_a_straight_run(void **state) {
  (void)state;
  Run r = run_gemc("train micro.gem -q --steps 10 --eval-every 5 --report ev_straight.json");
  if (r.rc != 0) fail_msg("rc %d: %s", r.rc, r.err);
  run_free(&r);
  r = run_gemc("train micro.gem -q --steps 5 --eval-every 5 --save ck_ev");
  assert_int_equal(r.rc, 0);
  run_free(&r);
  r = run_gemc("train micro.gem -q --steps 5 --eval-every 5 --resume ck_ev --save ck_ev "
               "--report ev_resumed.json");
  if (r.rc != 0) fail_msg("rc %d: %s", r.rc, r.err);
  run_free(&r);
  char *a = read_text(tmp_path("ev_straight.json")), *b = read_text(tmp_path("ev_resumed.json"));
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(strstr(a, "\"eval_examples\": 4096"));
  assert_non_null(strstr(b, "\"eval_examples\": 4096"));
  char *ea = json_object_text(a, "eval"), *eb = json_object_text(b, "eval");
  assert_non_null(ea);
  assert_non_null(eb);
  assert_string_equal(ea, eb);
  char *ca = json_array_text(a, "curve"), *cb = json_array_text(b, "curve");
  assert_non_null(ca);
  assert_non_null(cb);
  free(ea);
  free(eb);
  free(a);

  // --steps 0, twice: the same checkpoint and curve each time.
  char *ck = read_text(tmp_path("ck_ev/checkpoint.gemc"));
  struct stat st0, st1;
  assert_int_equal(stat(tmp_path("ck_ev/checkpoint.gemc"), &st0), 0);
  for (int i = 0; i < 2; i++) {
    r = run_gemc("train micro.gem -q --steps 0 --resume ck_ev --save ck_ev "
                 "--report ev_zero.json");
    if (r.rc != 0) fail_msg("rc %d: %s", r.rc, r.err);
    run_free(&r);
  }
  assert_int_equal(stat(tmp_path("ck_ev/checkpoint.gemc"), &st1), 0);
  assert_int_equal(st0.st_size, st1.st_size);
  char *ck1 = read_text(tmp_path("ck_ev/checkpoint.gemc"));
  assert_memory_equal(ck, ck1, (size_t)st0.st_size);
  char *z = read_text(tmp_path("ev_zero.json"));
  char *cz = json_array_text(z, "curve");
  assert_non_null(cz);
  assert_string_equal(cb, cz);
  free(ca);
  free(cb);
  free(cz);
  free(z);
  free(b);
  free(ck);
  free(ck1);
}

static int setup(void **state) {
  (void)state;
  if (!mkdtemp(tmp_dir)) return -1;
  write_text("micro.gem", micro_model);
  write_text("wider.gem", wider_model);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[PATH_MAX + 32];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  (void)argc;
  char guess[PATH_MAX];
  const char *slash = strrchr(argv[0], '/');
  int dir_len = slash ? (int)(slash - argv[0]) : 1;
  snprintf(guess, sizeof guess, "%.*s/../gemc", dir_len, slash ? argv[0] : ".");
  if (!realpath(guess, gemc_path)) {
    fprintf(stderr, "test_train: no gemc at %s\n", guess);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_train_resume_is_bit_exact),
      cmocka_unit_test(test_train_resume_refuses_another_model),
      cmocka_unit_test(test_train_overrides_with_an_artifact_are_refused),
      cmocka_unit_test(test_train_short_run_lowers_the_loss),
      cmocka_unit_test(test_train_progress_plain_and_live),
      cmocka_unit_test(test_train_json_checker_refuses_bad_json),
      cmocka_unit_test(test_train_cli_report_is_valid_json),
      cmocka_unit_test(test_train_cli_resume_matches_a_straight_run),
      cmocka_unit_test(test_train_cli_bad_flags_are_usage_errors),
      cmocka_unit_test(test_train_cli_cuda_backend_is_a_clear_error),
      cmocka_unit_test(test_train_cli_data_file_round_trip),
      cmocka_unit_test(test_train_divergence_stops_and_keeps_the_checkpoint),
      cmocka_unit_test(test_train_on_nan_skip_in_process),
      cmocka_unit_test(test_train_cli_on_nan),
      cmocka_unit_test(test_train_exploding_loss_warns_once),
      cmocka_unit_test(test_train_resume_evaluates_like_a_straight_run),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
