# The structured multi-turn loop as a Makefile (`make -f scripts/rl.mk multiturn` runs it): the policy
# asks the example knowledge-base environment (scripts/kb_env.py) with <query>relation(entity)</query>,
# reads the <information> it gets back, and answers in <answer></answer>.
#
# Layout:
#   runs/$(RUN)/sft.jsonl, sft.parquet, sft/      supervised warm start on worked rollouts
#   runs/$(RUN)/iter-0001/prompts.parquet         this iteration's questions (kb_env.py prompts)
#                         rollouts.parquet        generate-multiturn (G rollouts per prompt)
#                         scored.parquet          score: per-turn env rewards + exact match
#                         train.parquet           advantage (grpo-multiturn)
#                         model/                  update -> the next iteration's policy
#   runs/$(RUN)/curve.tsv                         turn reward, exact match, turns per iteration
#
# Rewards (scripts/kb_rewards.toml): the environment's turn reward of every model turn
# (kg_query_validity 0.1 + is_answer_score 0.1 + format_score 0.15, KG-R1's weights) as a turn
# component, exact match as a global one: reward = mean over turns + exact match.
include $(dir $(lastword $(MAKEFILE_LIST)))common.mk

RUN ?= multiturn
DIR := $(RUNS)/$(RUN)
MODEL ?= $(ROOT)/fixtures/tiny-qwen2
ENV := $(PYTHON) $(ROOT)/scripts/kb_env.py

ITERS ?= 8
PROMPTS_PER_ITER ?= 16
G ?= 4
MAX_TURNS ?= 3
MAX_NEW ?= 48
MAX_RESPONSE ?= 192
TEMPERATURE ?= 1.0
BATCH ?= 64
ENV_TIMEOUT ?= 30
REWARDS ?= $(ROOT)/scripts/kb_rewards.toml
ESTIMATOR ?= grpo-multiturn
ADV_FLAGS ?=
# 1e-3 (the countdown loop's rate) garbled the queries within three iterations (exact match
# 0.31 -> 0.05); 1e-4 keeps them.
LR ?= 1e-4
EPOCHS ?= 2
MINI_BATCHES ?= 4
MICRO_BATCH ?= 16
UPDATE_FLAGS ?= --loss-agg token-mean --grad-clip 1.0

SFT ?= 1
SFT_COUNT ?= 256
SFT_LR ?= 1e-2
SFT_EPOCHS ?= 8

GF := --seed $(SEED) --device $(DEVICE)
ITER_IDS := $(shell seq -f '%04g' 1 $(ITERS))
ifeq ($(SFT),1)
START := $(DIR)/sft
else
START := $(MODEL)
endif

EVAL_PROMPTS ?= 32
EVAL_G ?= 4

.PHONY: all curve eval clean
all: curve eval

$(DIR)/sft.parquet:
	@mkdir -p $(DIR)
	$(ENV) sft --count $(SFT_COUNT) --seed 1000 > $(DIR)/sft.jsonl
	$(RLCR) $(GF) prepare --from jsonl --input $(DIR)/sft.jsonl -o $@

$(DIR)/sft/config.json: $(DIR)/sft.parquet
	$(RLCR) $(GF) sft --model $(MODEL) --input $< -o $(DIR)/sft --lr $(SFT_LR) --epochs $(SFT_EPOCHS)

define ITER
$(DIR)/iter-$(1)/prompts.parquet:
	@mkdir -p $(DIR)/iter-$(1)
	$(ENV) prompts --count $(PROMPTS_PER_ITER) --seed $$$$((10#$(1) + 1000 * $(SEED))) > $(DIR)/iter-$(1)/prompts.jsonl
	$$(RLCR) $(GF) prepare --from jsonl --input $(DIR)/iter-$(1)/prompts.jsonl -o $$@

$(DIR)/iter-$(1)/rollouts.parquet: $(DIR)/iter-$(1)/prompts.parquet $(2)/config.json
	$$(RLCR) $(GF) generate-multiturn --model $(2) --input $$< -o $$@ --num-answers $(G) \
	  --env-cmd '$(ENV) serve' --env-timeout $(ENV_TIMEOUT) --stop '</query>' --stop '</answer>' \
	  --max-turns $(MAX_TURNS) --max-new-tokens $(MAX_NEW) --max-response-tokens $(MAX_RESPONSE) \
	  --temperature $(TEMPERATURE) --batch-size $(BATCH)

$(DIR)/iter-$(1)/scored.parquet: $(DIR)/iter-$(1)/rollouts.parquet
	$$(RLCR) $(GF) score --input $$< -o $$@ --verifier exact --format-gate off --rewards $(REWARDS)

$(DIR)/iter-$(1)/train.parquet: $(DIR)/iter-$(1)/scored.parquet
	$$(RLCR) $(GF) advantage --input $$< -o $$@ --estimator $(ESTIMATOR) $(ADV_FLAGS)

$(DIR)/iter-$(1)/model/config.json: $(DIR)/iter-$(1)/train.parquet $(2)/config.json
	$$(RLCR) $(GF) update --model $(2) --input $$< -o $(DIR)/iter-$(1)/model --lr $(LR) \
	  --epochs $(EPOCHS) --mini-batches $(MINI_BATCHES) --micro-batch $(MICRO_BATCH) $(UPDATE_FLAGS)
endef

prev = $(if $(filter 0001,$(1)),$(START),$(DIR)/iter-$(shell printf '%04d' $$((10#$(1) - 1)))/model)
$(foreach i,$(ITER_IDS),$(eval $(call ITER,$(i),$(call prev,$(i)))))

SCORED := $(foreach i,$(ITER_IDS),$(DIR)/iter-$(i)/scored.parquet)
$(DIR)/curve.tsv: $(SCORED) $(DIR)/iter-$(lastword $(ITER_IDS))/model/config.json
	$(PYTHON) $(ROOT)/scripts/multiturn_curve.py $(RLCR) $(SCORED) > $@
	@cat $@

curve: $(DIR)/curve.tsv

# Held-out evaluation: the starting policy and the last one on the same prompts and seed.
LAST := $(DIR)/iter-$(lastword $(ITER_IDS))/model
$(DIR)/eval/prompts.parquet:
	@mkdir -p $(DIR)/eval
	$(ENV) prompts --count $(EVAL_PROMPTS) --seed 99999 > $(DIR)/eval/prompts.jsonl
	$(RLCR) $(GF) prepare --from jsonl --input $(DIR)/eval/prompts.jsonl -o $@

define EVAL
$(DIR)/eval/$(1)/scored.parquet: $(DIR)/eval/prompts.parquet $(2)/config.json
	@mkdir -p $(DIR)/eval/$(1)
	$$(RLCR) $(GF) generate-multiturn --model $(2) --input $$< -o $(DIR)/eval/$(1)/rollouts.parquet \
	  --num-answers $(EVAL_G) --env-cmd '$(ENV) serve' --env-timeout $(ENV_TIMEOUT) --stop '</query>' \
	  --stop '</answer>' --max-turns $(MAX_TURNS) --max-new-tokens $(MAX_NEW) \
	  --max-response-tokens $(MAX_RESPONSE) --temperature $(TEMPERATURE) --batch-size $(BATCH)
	$$(RLCR) $(GF) score --input $(DIR)/eval/$(1)/rollouts.parquet -o $$@ --verifier exact \
	  --format-gate off --rewards $(REWARDS)
endef
$(eval $(call EVAL,start,$(START)))
$(eval $(call EVAL,final,$(LAST)))

$(DIR)/eval.tsv: $(DIR)/eval/start/scored.parquet $(DIR)/eval/final/scored.parquet
	$(PYTHON) $(ROOT)/scripts/multiturn_curve.py $(RLCR) $^ > $@
	@cat $@

eval: $(DIR)/eval.tsv

clean:
	rm -rf $(DIR)
