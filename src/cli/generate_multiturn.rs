//! `rlcr generate-multiturn`: multi-turn rollouts against an environment process.
//! A thin shell over [`crate::sample::multiturn_stage`].
use anyhow::Result;

use super::common::Global;
use super::flags::{ModelTable, SamplingArgs};
use crate::sample::multiturn::Limits;
use crate::sample::multiturn_stage::{self, Plan};

pub const ABOUT: &str =
    "Multi-turn rollouts against an environment process (tool calls, KG queries)";
pub const LONG_ABOUT: &str = "\
Sample G (--num-answers) multi-turn rollouts per prompt: the model writes a turn until a --stop
string (e.g. `</query>`, `</answer>`), an EOS token or --max-new-tokens; the environment (--env-cmd,
a process speaking JSON lines) replies with an observation, which joins the response as information
tokens, and the model's next turn continues from the KV cache; until the environment says done,
--max-turns model turns were written, or the response holds --max-response-tokens tokens (model and
observation tokens together; an observation that would overflow it ends the rollout, `length`).

Protocol, one JSON object per line. After each model turn rlcr writes
  {\"id\": 7, \"prompt_id\": \"kb-000003\", \"sample_id\": \"kb-000003/a1\", \"turn\": 0,
   \"messages\": [...], \"response_so_far\": \"...\", \"turn_text\": \"...\",
   \"finish\": \"stop\"|\"eos\"|\"length\", \"data_source\": \"kb\", \"ground_truth\": <JSON>}
and the environment answers
  {\"id\": 7, \"observation\": \"<information>...</information>\", \"done\": false,
   \"turn_reward\": 0.1, \"extra\": {...}}
(turn_reward and extra optional; replies matched by id, in any order). An environment that exits,
hangs longer than --env-timeout seconds, writes anything else, or answers an id it was not asked is
killed with its process group; rlcr exits 1 naming the request, and nothing is written.

Writes answer rows (trajectory schema) with info_mask (false on observation tokens),
token_turn_ids (model turn 0, 1, ...; -1 on observation tokens), response_logprobs (behaviour
log-probs of model tokens; 0 on observation tokens), turn_rewards (list<float32>, the
environment's turn_reward per model turn, null where none: `score --rewards` reads it with
`[[turn]] column = \"turn_rewards\"`), num_turns and env_extra (JSON list of each turn's extra).
finish_reason is `stop` when the environment ended the rollout, `length` when a limit did.
The same --seed gives the same table for any --batch-size (with a deterministic environment).
Example:
  python3 scripts/kb_env.py prompts --count 16 > kb.jsonl
  rlcr prepare --from jsonl --input kb.jsonl -o prompts.parquet
  rlcr generate-multiturn --model fixtures/tiny-qwen2 --input prompts.parquet -o rollouts.parquet \\
       --env-cmd 'python3 scripts/kb_env.py serve' --stop '</query>' --stop '</answer>' \\
       --num-answers 4 --max-turns 3 --max-new-tokens 32 --max-response-tokens 160";

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub stage: ModelTable,
    /// Rollouts per prompt.
    #[arg(long, default_value_t = 4)]
    pub num_answers: usize,
    /// The environment command (run with `sh -c`).
    #[arg(long)]
    pub env_cmd: String,
    /// Seconds to wait for each environment reply before killing it.
    #[arg(long, default_value_t = 30.0)]
    pub env_timeout: f64,
    /// Model turns per rollout at most.
    #[arg(long, default_value_t = 4)]
    pub max_turns: usize,
    /// Response tokens at most (model and observation tokens together).
    #[arg(long, default_value_t = 1024)]
    pub max_response_tokens: usize,
    /// System prompt replacing the prompt's own (\"\" for none); default: the prompt's messages.
    #[arg(long)]
    pub system_prompt: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(g: &Global, a: Args) -> Result<()> {
    let plan = Plan {
        env_timeout: Plan::env_timeout(a.env_timeout)?,
        job: a.stage.job(g, None)?,
        num_answers: a.num_answers,
        env_cmd: a.env_cmd,
        limits: Limits {
            max_turns: a.max_turns,
            max_response_tokens: a.max_response_tokens,
        },
        sampling: a.sampling.plan(),
        system_prompt: a.system_prompt,
    };
    let line = multiturn_stage::run(&plan)?;
    crate::info!("{line}");
    Ok(())
}
