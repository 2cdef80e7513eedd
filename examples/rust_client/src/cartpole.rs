//! CartPole, the classic cart-pole balancing task (Barto, Sutton and Anderson, 1983), with
//! gymnasium's `CartPole-v1` dynamics: Euler integration, 0.02 s steps, terminated when the
//! pole leans more than 12 degrees or the cart leaves [-2.4, 2.4].

use std::fmt;

const GRAVITY: f64 = 9.8;
const MASS_CART: f64 = 1.0;
const MASS_POLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASS_CART + MASS_POLE;
/// Half the pole's length.
const LENGTH: f64 = 0.5;
const POLE_MASS_LENGTH: f64 = MASS_POLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
const TAU: f64 = 0.02;
const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
const X_THRESHOLD: f64 = 2.4;

/// The observation's size: cart position, cart velocity, pole angle, pole angular velocity.
pub const OBS_DIM: usize = 4;

/// An action outside Discrete(2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidAction(pub i64);

impl fmt::Display for InvalidAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CartPole takes actions 0 (push left) and 1 (push right), not {}", self.0)
    }
}

impl std::error::Error for InvalidAction {}

/// What one step returns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    pub observation: [f32; OBS_DIM],
    /// 1.0 for every step, the terminating one included.
    pub reward: f64,
    pub terminated: bool,
}

/// splitmix64: a small, seedable generator for the start states (no dependency for four
/// uniform numbers per episode).
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [low, high).
    fn uniform(&mut self, low: f64, high: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        low + (high - low) * unit
    }
}

/// The simulator. The state is f64, as gymnasium keeps it; observations are its f32 copy.
#[derive(Debug, Clone)]
pub struct CartPole {
    state: [f64; OBS_DIM],
    rng: SplitMix64,
}

impl CartPole {
    /// A simulator whose start states come from `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self { state: [0.0; OBS_DIM], rng: SplitMix64(seed) }
    }

    /// Starts an episode: every state variable uniform in [-0.05, 0.05).
    pub fn reset(&mut self) -> [f32; OBS_DIM] {
        for s in &mut self.state {
            *s = self.rng.uniform(-0.05, 0.05);
        }
        self.observation()
    }

    /// Sets the state (for tests against a reference).
    pub fn set_state(&mut self, state: [f64; OBS_DIM]) {
        self.state = state;
    }

    #[must_use]
    #[allow(clippy::cast_possible_truncation)] // the observation space is float32
    pub fn observation(&self) -> [f32; OBS_DIM] {
        self.state.map(|s| s as f32)
    }

    /// Pushes the cart left (0) or right (1) for one step.
    pub fn step(&mut self, action: i64) -> Result<Step, InvalidAction> {
        let force = match action {
            0 => -FORCE_MAG,
            1 => FORCE_MAG,
            other => return Err(InvalidAction(other)),
        };
        let [x, x_dot, theta, theta_dot] = self.state;
        let (sin, cos) = theta.sin_cos();
        let temp = (force + POLE_MASS_LENGTH * theta_dot * theta_dot * sin) / TOTAL_MASS;
        let theta_acc =
            (GRAVITY * sin - cos * temp) / (LENGTH * (4.0 / 3.0 - MASS_POLE * cos * cos / TOTAL_MASS));
        let x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS;
        self.state =
            [x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot, theta_dot + TAU * theta_acc];
        let [x, _, theta, _] = self.state;
        let terminated = !(-X_THRESHOLD..=X_THRESHOLD).contains(&x)
            || !(-THETA_THRESHOLD..=THETA_THRESHOLD).contains(&theta);
        Ok(Step { observation: self.observation(), reward: 1.0, terminated })
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // the values are compared bit for bit on purpose
mod tests {
    use super::*;

    #[test]
    fn steps_match_gymnasium() {
        // gymnasium 1.x CartPole-v1: state (0.01, -0.02, 0.03, 0.04), then actions 1, 0.
        let mut env = CartPole::new(0);
        env.set_state([0.01, -0.02, 0.03, 0.04]);
        let a = env.step(1).unwrap();
        // The float32 observations, as numpy's tolist() prints them (f64 of each f32).
        assert_eq!(
            a.observation.map(f64::from),
            [
                0.009_600_000_455_975_533,
                0.174_679_189_920_425_42,
                0.030_799_999_833_106_995,
                -0.243_068_724_870_681_76
            ]
        );
        let b = env.step(0).unwrap();
        assert_eq!(
            b.observation.map(f64::from),
            [
                0.013_093_584_217_131_138,
                -0.020_868_849_009_275_436,
                0.025_938_626_378_774_643,
                0.059_167_999_774_217_606
            ]
        );
        assert!(!a.terminated && !b.terminated);
        assert_eq!(a.reward, 1.0);
    }

    #[test]
    fn the_pole_falls_when_pushed_one_way() {
        let mut env = CartPole::new(7);
        let start = env.reset();
        assert!(start.iter().all(|s| (-0.05..0.05).contains(s)));
        let steps = (1..=100).find(|_| env.step(1).unwrap().terminated).expect("the pole falls");
        assert!((5..40).contains(&steps), "fell after {steps} steps");
    }

    #[test]
    fn resets_are_seeded_and_actions_checked() {
        let (mut a, mut b) = (CartPole::new(3), CartPole::new(3));
        assert_eq!(a.reset(), b.reset());
        assert_ne!(a.reset(), CartPole::new(4).reset());
        assert_eq!(a.step(2), Err(InvalidAction(2)));
    }
}
