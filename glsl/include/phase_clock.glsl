// Phase clocks of the register-resident sweeps, for tools/sweep_phases.py. With PHASE_CLOCK (the
// binding of a uint buffer) and PHASE_STEPS defined, PHASE(step, ph) stores the SM clock
// (GL_ARB_shader_clock: cycles) of workgroup 0's first invocation at phase ph < 8 of step
// `step` < PHASE_STEPS into phase_clock[step * 8 + ph]. Without them PHASE is nothing and the
// shader compiles to the same SPIR-V. Include before any declaration (it may add an extension).
#ifndef CATCHAT_PHASE_CLOCK_GLSL
#define CATCHAT_PHASE_CLOCK_GLSL
#ifdef PHASE_CLOCK
#extension GL_ARB_shader_clock : require
layout(set = 0, binding = PHASE_CLOCK) writeonly buffer PhaseClock { uint phase_clock[]; };
#define PHASE(step, ph) \
    if (gl_LocalInvocationIndex == 0u && gl_WorkGroupID.x == 0u && (step) < PHASE_STEPS) \
        phase_clock[(step) * 8u + (ph)] = clock2x32ARB().x
#else
#define PHASE(step, ph)
#endif
#endif
