/* SPDX-License-Identifier: Apache-2.0 */
/* Programs and their checks: see program_check.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/host/program_nodes.h"
#include "tests/lib/program_check.h"
#include "tests/lib/rand.h"

const struct tl_prog_case tl_prog_cases[] = {
	{ "chain over a bias, bf16",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[1000,1024]},"
	  "{'name':'b','kind':'input','dtype':'bf16','shape':[1024]},"
	  "{'name':'h','kind':'intermediate','dtype':'f32','shape':[1000,1024]},"
	  "{'name':'g','kind':'intermediate','dtype':'f32','shape':[1000,1024]},"
	  "{'name':'y','kind':'output','dtype':'bf16','shape':[1000,1024]},"
	  "{'name':'dg','kind':'output','dtype':'bf16','shape':[1000,1024]}],"
	  "'nodes':[{'op':'add','inputs':['x','b'],'outputs':['h']},"
	  "{'op':'gelu','inputs':['h'],'outputs':['g']},"
	  "{'op':'mul','inputs':['g'],'outputs':['y'],'attrs':{'scalar':0.5}},"
	  "{'op':'gelu_backward','inputs':['y','h'],'outputs':['dg']}]}",
	  -3, 3, 0 },
	{ "every unary op, f32",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[77,131]},"
	  "{'name':'a','kind':'intermediate','dtype':'f32','shape':[77,131]},"
	  "{'name':'y1','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y2','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y3','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y4','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y5','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y6','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y7','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y8','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y9','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y10','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y11','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y12','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y13','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y14','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y15','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y16','kind':'output','dtype':'f32','shape':[77,131]}],"
	  "'nodes':[{'op':'abs','inputs':['x'],'outputs':['a']},"
	  "{'op':'neg','inputs':['x'],'outputs':['y1']},{'op':'exp','inputs':['x'],'outputs':['y2']},"
	  "{'op':'log','inputs':['a'],'outputs':['y3']},{'op':'tanh','inputs':['x'],'outputs':['y4']},"
	  "{'op':'erf','inputs':['x'],'outputs':['y5']},{'op':'sigmoid','inputs':['x'],'outputs':['y6']},"
	  "{'op':'silu','inputs':['x'],'outputs':['y7']},{'op':'gelu','inputs':['x'],'outputs':['y8']},"
	  "{'op':'gelu_tanh','inputs':['x'],'outputs':['y9']},{'op':'relu','inputs':['x'],'outputs':['y10']},"
	  "{'op':'sqrt','inputs':['a'],'outputs':['y11']},{'op':'rsqrt','inputs':['a'],'outputs':['y12']},"
	  "{'op':'reciprocal','inputs':['x'],'outputs':['y13']},{'op':'square','inputs':['x'],'outputs':['y14']},"
	  "{'op':'pow','inputs':['a'],'outputs':['y15'],'attrs':{'scalar':1.7}},"
	  "{'op':'pow','inputs':['a'],'outputs':['y16'],'attrs':{'scalar':-0.5}}]}",
	  -3, 3, 0 },
	{ "binary ops, gradients, comparisons and where, f16 and f64",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'f16','shape':[64,96]},"
	  "{'name':'z','kind':'input','dtype':'f64','shape':[64,96]},"
	  "{'name':'s','kind':'scalar'},"
	  "{'name':'y1','kind':'output','dtype':'f64','shape':[64,96]},{'name':'y2','kind':'output','dtype':'f16','shape':[64,96]},"
	  "{'name':'y3','kind':'output','dtype':'f32','shape':[64,96]},{'name':'y4','kind':'output','dtype':'f64','shape':[64,96]},"
	  "{'name':'y5','kind':'output','dtype':'f32','shape':[64,96]},{'name':'y6','kind':'output','dtype':'f32','shape':[64,96]},"
	  "{'name':'y7','kind':'output','dtype':'f32','shape':[64,96]},{'name':'y8','kind':'output','dtype':'f32','shape':[64,96]},"
	  "{'name':'y9','kind':'output','dtype':'f32','shape':[64,96]},{'name':'y10','kind':'output','dtype':'f32','shape':[64,96]},"
	  "{'name':'c1','kind':'output','dtype':'u8','shape':[64,96]},{'name':'c2','kind':'output','dtype':'f32','shape':[64,96]},"
	  "{'name':'w','kind':'output','dtype':'f16','shape':[64,96]},{'name':'mx','kind':'output','dtype':'f32','shape':[64,96]}],"
	  "'nodes':[{'op':'add','inputs':['x','z'],'outputs':['y1']},{'op':'sub','inputs':['z','x'],'outputs':['y2']},"
	  "{'op':'mul','inputs':['x','s'],'outputs':['y3']},{'op':'div','inputs':['z','x'],'outputs':['y4']},"
	  "{'op':'gelu_tanh_backward','inputs':['x','z'],'outputs':['y5']},"
	  "{'op':'silu_backward','inputs':['x','z'],'outputs':['y6']},"
	  "{'op':'sigmoid_backward','inputs':['x','z'],'outputs':['y7']},"
	  "{'op':'tanh_backward','inputs':['x','z'],'outputs':['y8']},"
	  "{'op':'relu_backward','inputs':['x','z'],'outputs':['y9']},"
	  "{'op':'sub','inputs':['x'],'outputs':['y10'],'attrs':{'scalar':1.5,'scalar_first':true}},"
	  "{'op':'gt','inputs':['x','z'],'outputs':['c1']},{'op':'le','inputs':['x'],'outputs':['c2'],'attrs':{'scalar':0.25}},"
	  "{'op':'where','inputs':['c1','x'],'outputs':['w'],'attrs':{'scalar':-7}},"
	  "{'op':'maximum','inputs':['x','z'],'outputs':['mx']}]}",
	  -2, 2, 0 },
	{ "broadcasts, a transposed input, a strided output view, iota and fill",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[6,7,8]},"
	  "{'name':'col','kind':'input','dtype':'bf16','shape':[6,1,8]},"
	  "{'name':'r0','kind':'input','dtype':'f32','shape':[]},"
	  "{'name':'m','kind':'input','dtype':'f32','shape':[8,7,6]},"
	  "{'name':'mt','kind':'view','base':'m','shape':[6,7,8],'strides':[1,6,42]},"
	  "{'name':'big','kind':'output','dtype':'f32','shape':[6,7,20]},"
	  "{'name':'mid','kind':'view','base':'big','shape':[6,7,8],'strides':[140,20,1],'offset':5},"
	  "{'name':'io','kind':'intermediate','dtype':'i64','shape':[7,1]},"
	  "{'name':'iof','kind':'intermediate','dtype':'f32','shape':[7,1]},"
	  "{'name':'t1','kind':'intermediate','dtype':'f32','shape':[6,7,8]},"
	  "{'name':'t2','kind':'intermediate','dtype':'f32','shape':[6,7,8]},"
	  "{'name':'f','kind':'output','dtype':'bf16','shape':[6,7,8]}],"
	  "'nodes':[{'op':'mul','inputs':['x','col'],'outputs':['t1']},"
	  "{'op':'iota','outputs':['io'],'attrs':{'axis':0}},"
	  "{'op':'cast','inputs':['io'],'outputs':['iof']},"
	  "{'op':'add','inputs':['t1','iof'],'outputs':['t2']},"
	  "{'op':'sub','inputs':['t2','mt'],'outputs':['mid']},"
	  "{'op':'fill','outputs':['f'],'attrs':{'scalar':0.1}},"
	  "{'op':'div','inputs':['mid','r0'],'outputs':['mid']}]}",
	  0.5, 2, 0 },
	{ "dropout masks: stored, through a transposed view, drawn inline in a chain, broadcast, in reductions' "
	  "prologues, rank 0; every mask read exactly (integers, sums in f64)",
	  "{'tensors':[{'name':'seed','kind':'scalar'},"
	  "{'name':'x','kind':'input','dtype':'bf16','shape':[48,1000]},"
	  "{'name':'m','kind':'output','dtype':'u8','shape':[48,1000]},"
	  "{'name':'mem','kind':'output','dtype':'u8','shape':[1000,48]},"
	  "{'name':'mt','kind':'view','base':'mem','shape':[48,1000],'strides':[1,48]},"
	  "{'name':'k','kind':'intermediate','dtype':'bf16','shape':[48,1000]},"
	  "{'name':'t','kind':'intermediate','dtype':'f32','shape':[48,1000]},"
	  "{'name':'y','kind':'output','dtype':'bf16','shape':[48,1000]},"
	  "{'name':'ki','kind':'output','dtype':'i32','shape':[48,1000]},"
	  "{'name':'kr','kind':'intermediate','dtype':'f32','shape':[48,1]},"
	  "{'name':'mb','kind':'output','dtype':'u8','shape':[48,1000]},"
	  "{'name':'kl','kind':'intermediate','dtype':'f16','shape':[48,1000]},"
	  "{'name':'rl','kind':'output','dtype':'f64','shape':[48]},"
	  "{'name':'rc','kind':'output','dtype':'f64','shape':[1000]},"
	  "{'name':'m0','kind':'output','dtype':'f64','shape':[]},"
	  "{'name':'mi','kind':'output','dtype':'i64','shape':[7,3]}],"
	  "'nodes':[{'op':'dropout_mask','inputs':['seed'],'outputs':['m'],'attrs':{'p':0.1}},"
	  "{'op':'dropout_mask','inputs':['seed'],'outputs':['mt'],'attrs':{'p':0.5,'stream':1}},"
	  "{'op':'dropout_mask','inputs':['seed'],'outputs':['k'],'attrs':{'p':0.1,'stream':2}},"
	  "{'op':'mul','inputs':['x','k'],'outputs':['t']},"
	  "{'op':'mul','inputs':['t'],'outputs':['y'],'attrs':{'scalar':1.1111111111111112}},"
	  "{'op':'cast','inputs':['k'],'outputs':['ki']},"
	  "{'op':'dropout_mask','inputs':['seed'],'outputs':['kr'],'attrs':{'p':0.25,'stream':3}},"
	  "{'op':'cast','inputs':['kr'],'outputs':['mb']},"
	  "{'op':'dropout_mask','inputs':['seed'],'outputs':['kl'],'attrs':{'p':0.3,'stream':4}},"
	  "{'op':'sum','inputs':['kl'],'outputs':['rl']},"
	  "{'op':'sum','inputs':['kl'],'outputs':['rc'],'attrs':{'axis':'leading'}},"
	  "{'op':'dropout_mask','inputs':['seed'],'outputs':['m0'],'attrs':{'p':0.5,'stream':5}},"
	  "{'op':'dropout_mask','inputs':['seed'],'outputs':['mi'],'attrs':{'p':0.5,'stream':4294967295}}]}",
	  -2, 2, 0 },
	{ "every reduction over rows, short and long, with a prologue (logsumexp's online pairs too)",
	  "{'tensors':[{'name':'a','kind':'input','dtype':'bf16','shape':[64,100]},"
	  "{'name':'b','kind':'input','dtype':'f32','shape':[8,50000]},"
	  "{'name':'sa','kind':'intermediate','dtype':'f32','shape':[64,100]},"
	  "{'name':'r1','kind':'output','dtype':'f32','shape':[64]},{'name':'r2','kind':'output','dtype':'bf16','shape':[64,1]},"
	  "{'name':'r3','kind':'output','dtype':'f32','shape':[64]},{'name':'r4','kind':'output','dtype':'f32','shape':[64]},"
	  "{'name':'r5','kind':'output','dtype':'f32','shape':[64]},"
	  "{'name':'q1','kind':'output','dtype':'f32','shape':[8]},{'name':'q2','kind':'output','dtype':'f64','shape':[8,1]},"
	  "{'name':'q3','kind':'output','dtype':'f32','shape':[8]},{'name':'q4','kind':'output','dtype':'f32','shape':[8]},"
	  "{'name':'q5','kind':'output','dtype':'f32','shape':[8]},"
	  "{'name':'r6','kind':'output','dtype':'f32','shape':[64]},{'name':'q6','kind':'output','dtype':'f32','shape':[8,1]}],"
	  "'nodes':[{'op':'mul','inputs':['a','a'],'outputs':['sa']},"
	  "{'op':'sum','inputs':['sa'],'outputs':['r1']},{'op':'mean','inputs':['a'],'outputs':['r2']},"
	  "{'op':'max','inputs':['a'],'outputs':['r3']},{'op':'min','inputs':['a'],'outputs':['r4']},"
	  "{'op':'amax','inputs':['a'],'outputs':['r5']},"
	  "{'op':'sum','inputs':['b'],'outputs':['q1']},{'op':'mean','inputs':['b'],'outputs':['q2']},"
	  "{'op':'max','inputs':['b'],'outputs':['q3']},{'op':'min','inputs':['b'],'outputs':['q4']},"
	  "{'op':'amax','inputs':['b'],'outputs':['q5']},"
	  "{'op':'logsumexp','inputs':['a'],'outputs':['r6']},{'op':'logsumexp','inputs':['b'],'outputs':['q6']}]}",
	  -2, 2, 0 },
	{ "every reduction over leading dims, one pass and two",
	  "{'tensors':[{'name':'a','kind':'input','dtype':'f32','shape':[3,20,10]},"
	  "{'name':'b','kind':'input','dtype':'bf16','shape':[20000,300]},"
	  "{'name':'r1','kind':'output','dtype':'f32','shape':[10]},{'name':'r2','kind':'output','dtype':'f32','shape':[1,1,10]},"
	  "{'name':'r3','kind':'output','dtype':'f32','shape':[10]},{'name':'r4','kind':'output','dtype':'f32','shape':[10]},"
	  "{'name':'r5','kind':'output','dtype':'f32','shape':[10]},"
	  "{'name':'q1','kind':'output','dtype':'f32','shape':[300]},{'name':'q2','kind':'output','dtype':'bf16','shape':[1,300]},"
	  "{'name':'q3','kind':'output','dtype':'f32','shape':[300]},{'name':'q4','kind':'output','dtype':'f32','shape':[300]},"
	  "{'name':'q5','kind':'output','dtype':'f32','shape':[300]}],"
	  "'nodes':[{'op':'sum','inputs':['a'],'outputs':['r1'],'attrs':{'axis':'leading'}},"
	  "{'op':'mean','inputs':['a'],'outputs':['r2'],'attrs':{'axis':'leading'}},"
	  "{'op':'max','inputs':['a'],'outputs':['r3'],'attrs':{'axis':'leading'}},"
	  "{'op':'min','inputs':['a'],'outputs':['r4'],'attrs':{'axis':'leading'}},"
	  "{'op':'amax','inputs':['a'],'outputs':['r5'],'attrs':{'axis':'leading'}},"
	  "{'op':'sum','inputs':['b'],'outputs':['q1'],'attrs':{'axis':'leading'}},"
	  "{'op':'mean','inputs':['b'],'outputs':['q2'],'attrs':{'axis':'leading'}},"
	  "{'op':'max','inputs':['b'],'outputs':['q3'],'attrs':{'axis':'leading'}},"
	  "{'op':'min','inputs':['b'],'outputs':['q4'],'attrs':{'axis':'leading'}},"
	  "{'op':'amax','inputs':['b'],'outputs':['q5'],'attrs':{'axis':'leading'}}]}",
	  -2, 2, 0 },
	{ "softmax, log_softmax and their backwards",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[4,8,64,129]},"
	  "{'name':'dy','kind':'input','dtype':'bf16','shape':[4,8,64,129]},"
	  "{'name':'y','kind':'output','dtype':'bf16','shape':[4,8,64,129]},"
	  "{'name':'ly','kind':'output','dtype':'f32','shape':[4,8,64,129]},"
	  "{'name':'dx','kind':'output','dtype':'bf16','shape':[4,8,64,129]},"
	  "{'name':'dlx','kind':'output','dtype':'f32','shape':[4,8,64,129]}],"
	  "'nodes':[{'op':'softmax','inputs':['x'],'outputs':['y']},{'op':'log_softmax','inputs':['x'],'outputs':['ly']},"
	  "{'op':'softmax_backward','inputs':['dy','y'],'outputs':['dx']},"
	  "{'op':'log_softmax_backward','inputs':['dy','ly'],'outputs':['dlx']}]}",
	  -4, 4, 0 },
	{ "cross_entropy and its backward",
	  "{'tensors':[{'name':'logits','kind':'input','dtype':'bf16','shape':[300,5003]},"
	  "{'name':'t','kind':'input','dtype':'i64','shape':[300]},"
	  "{'name':'loss','kind':'output','dtype':'f32','shape':[300]},"
	  "{'name':'lse','kind':'output','dtype':'f32','shape':[300,1]},"
	  "{'name':'dloss','kind':'input','dtype':'f32','shape':[300]},"
	  "{'name':'dlogits','kind':'output','dtype':'bf16','shape':[300,5003]}],"
	  "'nodes':[{'op':'cross_entropy','inputs':['logits','t'],'outputs':['loss','lse'],'attrs':{'ignore_index':7}},"
	  "{'op':'cross_entropy_backward','inputs':['dloss','logits','t','lse'],'outputs':['dlogits']}]}",
	  -4, 4, 5003 },
	{ "rms_norm and its backward",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[256,2048]},"
	  "{'name':'w','kind':'input','dtype':'bf16','shape':[2048]},"
	  "{'name':'dy','kind':'input','dtype':'bf16','shape':[256,2048]},"
	  "{'name':'y','kind':'output','dtype':'bf16','shape':[256,2048]},"
	  "{'name':'rstd','kind':'output','dtype':'f32','shape':[256,1]},"
	  "{'name':'dx','kind':'output','dtype':'bf16','shape':[256,2048]},"
	  "{'name':'dw','kind':'output','dtype':'f32','shape':[2048]}],"
	  "'nodes':[{'op':'rms_norm','inputs':['x','w'],'outputs':['y','rstd'],'attrs':{'eps':1e-6}},"
	  "{'op':'rms_norm_backward','inputs':['dy','x','w','rstd'],'outputs':['dx','dw']}]}",
	  -2, 2, 0 },
	{ "rotary and its backward",
	  "{'tensors':[{'name':'q','kind':'input','dtype':'bf16','shape':[2,128,4,64]},"
	  "{'name':'cos','kind':'input','dtype':'f32','shape':[128,32]},"
	  "{'name':'sin','kind':'input','dtype':'f32','shape':[128,32]},"
	  "{'name':'qr','kind':'output','dtype':'bf16','shape':[2,128,4,64]},"
	  "{'name':'dq','kind':'output','dtype':'bf16','shape':[2,128,4,64]}],"
	  "'nodes':[{'op':'rotary','inputs':['q','cos','sin'],'outputs':['qr']},"
	  "{'op':'rotary_backward','inputs':['qr','cos','sin'],'outputs':['dq']}]}",
	  -1, 1, 0 },
	{ "adamw and sgd, in place",
	  "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[1000,33]},"
	  "{'name':'g','kind':'input','dtype':'bf16','shape':[1000,33]},"
	  "{'name':'m','kind':'inout','dtype':'f32','shape':[1000,33]},"
	  "{'name':'v','kind':'inout','dtype':'f32','shape':[1000,33]},"
	  "{'name':'b','kind':'inout','dtype':'bf16','shape':[777]},"
	  "{'name':'gb','kind':'input','dtype':'bf16','shape':[777]},"
	  "{'name':'mb','kind':'inout','dtype':'f32','shape':[777]},"
	  "{'name':'lr','kind':'scalar'},{'name':'step','kind':'scalar'}],"
	  "'nodes':[{'op':'adamw','inputs':['p','g','m','v'],'attrs':{'lr':'lr','step':'step','weight_decay':0.1}},"
	  "{'op':'sgd','inputs':['b','gb','mb'],'attrs':{'lr':'lr','momentum':0.9,'nesterov':true}}]}",
	  0.01, 1, 0 },
	{ "embedding and its backward, repeated indices",
	  "{'tensors':[{'name':'wte','kind':'input','dtype':'bf16','shape':[50,96]},"
	  "{'name':'ids','kind':'input','dtype':'i32','shape':[4,100]},"
	  "{'name':'e','kind':'output','dtype':'bf16','shape':[4,100,96]},"
	  "{'name':'de','kind':'input','dtype':'bf16','shape':[400,96]},"
	  "{'name':'dwte','kind':'output','dtype':'f32','shape':[50,96]}],"
	  "'nodes':[{'op':'embedding','inputs':['wte','ids'],'outputs':['e']},"
	  "{'op':'embedding_backward','inputs':['de','ids'],'outputs':['dwte']}]}",
	  -1, 1, 50 },
	{ "embedding backward over 4500 strided positions, i64, sorted in three merge passes",
	  "{'tensors':[{'name':'ids','kind':'input','dtype':'i64','shape':[1500,6]},"
	  "{'name':'idt','kind':'view','base':'ids','shape':[3,1500],'strides':[2,6]},"
	  "{'name':'de','kind':'input','dtype':'f16','shape':[3,1500,40]},"
	  "{'name':'dwte','kind':'output','dtype':'bf16','shape':[37,40]}],"
	  "'nodes':[{'op':'embedding_backward','inputs':['de','idt'],'outputs':['dwte']}]}",
	  -1, 1, 37 },
	/* Fusion: what models compiled through regen.torch give (the
	 * lowering's [rows, last] frame), planned into few kernels. */
	{ "rms_norm as a model writes it, after a residual add: one kernel (the mean's epilogue)",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[96,1024]},"
	  "{'name':'res','kind':'input','dtype':'bf16','shape':[96,1024]},"
	  "{'name':'w','kind':'input','dtype':'bf16','shape':[1024]},"
	  "{'name':'hs','kind':'output','dtype':'bf16','shape':[96,1024]},"
	  "{'name':'h','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'sq','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'ms','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'msv','kind':'view','base':'ms','shape':[96],'strides':[1]},"
	  "{'name':'e','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'r','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'hn','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'hb','kind':'intermediate','dtype':'bf16','shape':[96,1024]},"
	  "{'name':'y','kind':'output','dtype':'bf16','shape':[96,1024]}],"
	  "'nodes':[{'op':'add','inputs':['x','res'],'outputs':['hs']},"
	  "{'op':'cast','inputs':['hs'],'outputs':['h']},{'op':'square','inputs':['h'],'outputs':['sq']},"
	  "{'op':'mean','inputs':['sq'],'outputs':['msv']},"
	  "{'op':'add','inputs':['ms'],'outputs':['e'],'attrs':{'scalar':1e-6}},"
	  "{'op':'rsqrt','inputs':['e'],'outputs':['r']},{'op':'mul','inputs':['h','r'],'outputs':['hn']},"
	  "{'op':'cast','inputs':['hn'],'outputs':['hb']},{'op':'mul','inputs':['hb','w'],'outputs':['y']}]}",
	  -2, 2, 0, 1 },
	{ "a loss as regen.torch lowers F.cross_entropy (log_softmax, then nll_loss's pick and sums): the log-softmax one "
	  "kernel, the loss's sums with their division",
	  "{'tensors':[{'name':'in1','kind':'input','dtype':'bf16','shape':[4,16,1000],'strides':[16000,1000,1]},"
	  "{'name':'w2','kind':'view','base':'in1','shape':[64,1000],'strides':[1000,1],'offset':0},"
	  "{'name':'t3','kind':'output','dtype':'f32','shape':[64,1000]},"
	  "{'name':'in4','kind':'input','dtype':'i32','shape':[64],'strides':[1]},"
	  "{'name':'x5','kind':'intermediate','dtype':'u8','shape':[64]},"
	  "{'name':'x6','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'x7','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'x8','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'x9','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'x10','kind':'intermediate','dtype':'u8','shape':[64]},"
	  "{'name':'x11','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'x12','kind':'intermediate','dtype':'u8','shape':[64]},"
	  "{'name':'x13','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'x14','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'x15','kind':'intermediate','dtype':'i64','shape':[64]},"
	  "{'name':'x16','kind':'intermediate','dtype':'f32','shape':[64,1]},"
	  "{'name':'w17','kind':'view','base':'t3','shape':[64000,1],'strides':[1,1],'offset':0},"
	  "{'name':'x18','kind':'intermediate','dtype':'f32','shape':[64]},"
	  "{'name':'w19','kind':'view','base':'x16','shape':[64],'strides':[1],'offset':0},"
	  "{'name':'x20','kind':'intermediate','dtype':'f32','shape':[64]},"
	  "{'name':'x21','kind':'intermediate','dtype':'f32','shape':[64]},"
	  "{'name':'t22','kind':'output','dtype':'f32','shape':[1]},"
	  "{'name':'v23','kind':'view','base':'t22','shape':[],'strides':[],'offset':0},"
	  "{'name':'x24','kind':'intermediate','dtype':'f32','shape':[1]},"
	  "{'name':'w25','kind':'view','base':'x24','shape':[],'strides':[],'offset':0},"
	  "{'name':'t26','kind':'output','dtype':'f32','shape':[1]},"
	  "{'name':'v27','kind':'view','base':'t26','shape':[],'strides':[],'offset':0}],"
	  "'nodes':[{'op':'log_softmax','inputs':['w2'],'outputs':['t3']},"
	  "{'op':'ne','inputs':['in4'],'outputs':['x5'],'attrs':{'scalar':-100.0}},"
	  "{'op':'cast','inputs':['in4'],'outputs':['x6']},"
	  "{'op':'iota','inputs':[],'outputs':['x7'],'attrs':{'axis':0}},"
	  "{'op':'mul','inputs':['x7'],'outputs':['x8'],'attrs':{'scalar':1000.0}},"
	  "{'op':'add','inputs':['x8','x6'],'outputs':['x9']},"
	  "{'op':'ge','inputs':['in4'],'outputs':['x10'],'attrs':{'scalar':0.0}},"
	  "{'op':'where','inputs':['x10','x9'],'outputs':['x11'],'attrs':{'scalar':-1.0}},"
	  "{'op':'lt','inputs':['in4'],'outputs':['x12'],'attrs':{'scalar':1000.0}},"
	  "{'op':'where','inputs':['x12','x11'],'outputs':['x13'],'attrs':{'scalar':-1.0}},"
	  "{'op':'where','inputs':['x5','x13'],'outputs':['x14'],'attrs':{'scalar':0.0}},"
	  "{'op':'cast','inputs':['x14'],'outputs':['x15']},"
	  "{'op':'embedding','inputs':['w17','x15'],'outputs':['x16']},"
	  "{'op':'neg','inputs':['w19'],'outputs':['x18']},"
	  "{'op':'where','inputs':['x5','x18'],'outputs':['x20'],'attrs':{'scalar':0.0}},"
	  "{'op':'cast','inputs':['x5'],'outputs':['x21']},"
	  "{'op':'sum','inputs':['x21'],'outputs':['v23'],'attrs':{'axis':'last'}},"
	  "{'op':'sum','inputs':['x20'],'outputs':['w25'],'attrs':{'axis':'last'}},"
	  "{'op':'div','inputs':['w25','v23'],'outputs':['v27']}]}",
	  -4, 4, 1000, 4 },
	{ "a loss's backward of saved log-probabilities: the gradient's scale a quotient of two 0-d tensors, lse a "
	  "fill of zeros read as a column (computed where it is read); the kept rows' mask and the scale apart",
	  "{'tensors':[{'name':'g','kind':'input','dtype':'f32','shape':[]},"
	  "{'name':'c','kind':'input','dtype':'f32','shape':[]},"
	  "{'name':'x1','kind':'intermediate','dtype':'f32','shape':[64]},"
	  "{'name':'x4','kind':'intermediate','dtype':'f32','shape':[64]},"
	  "{'name':'ls','kind':'input','dtype':'f32','shape':[64,1000]},"
	  "{'name':'tg','kind':'input','dtype':'i64','shape':[64]},"
	  "{'name':'t7','kind':'intermediate','dtype':'f32','shape':[64,1000]},"
	  "{'name':'dl','kind':'output','dtype':'bf16','shape':[64,1000]}],"
	  "'nodes':[{'op':'div','inputs':['g','c'],'outputs':['x1']},"
	  "{'op':'fill','outputs':['x4'],'attrs':{'scalar':0}},"
	  "{'op':'cross_entropy_backward','inputs':['x1','ls','tg','x4'],'outputs':['t7'],'attrs':{'ignore_index':-100}},"
	  "{'op':'cast','inputs':['t7'],'outputs':['dl']}]}",
	  0.5, 2, 1000, 3 },
	{ "a loss's backward as Llama's compiled graph gives it (regen.torch recomputes the log-probabilities): the "
	  "rows' logsumexp of the bf16 logits and the gradient over them in one kernel, its scale a quotient of two "
	  "0-d tensors apart",
	  "{'tensors':[{'name':'g','kind':'input','dtype':'f32','shape':[]},"
	  "{'name':'c','kind':'input','dtype':'f32','shape':[]},"
	  "{'name':'x','kind':'input','dtype':'bf16','shape':[64,1000]},"
	  "{'name':'lse','kind':'intermediate','dtype':'f32','shape':[64]},"
	  "{'name':'x1','kind':'intermediate','dtype':'f32','shape':[64]},"
	  "{'name':'tg','kind':'input','dtype':'i64','shape':[64]},"
	  "{'name':'t7','kind':'intermediate','dtype':'f32','shape':[64,1000]},"
	  "{'name':'dl','kind':'output','dtype':'bf16','shape':[64,1000]}],"
	  "'nodes':[{'op':'logsumexp','inputs':['x'],'outputs':['lse'],'attrs':{'axis':'last'}},"
	  "{'op':'div','inputs':['g','c'],'outputs':['x1']},"
	  "{'op':'cross_entropy_backward','inputs':['x1','x','tg','lse'],'outputs':['t7'],'attrs':{'ignore_index':-1}},"
	  "{'op':'cast','inputs':['t7'],'outputs':['dl']}]}",
	  -4, 4, 1000, 2 },
	{ "a loss's forward as Llama's compiled graph gives it (regen.torch recomputes the log-probabilities in the "
	  "backward): the rows' logsumexp of the bf16 logits and each target's logit by a gather, never the "
	  "log-probabilities",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[2,32,1000]},"
	  "{'name':'xr','kind':'view','base':'x','shape':[64,1000],'strides':[1000,1]},"
	  "{'name':'flat','kind':'view','base':'xr','shape':[64000,1],'strides':[1,1]},"
	  "{'name':'tg','kind':'input','dtype':'i64','shape':[64]},"
	  "{'name':'lse','kind':'intermediate','dtype':'f32','shape':[64]},"
	  "{'name':'tf','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'row','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'start','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'at','kind':'intermediate','dtype':'f64','shape':[64]},"
	  "{'name':'idx','kind':'intermediate','dtype':'i64','shape':[64]},"
	  "{'name':'pk','kind':'intermediate','dtype':'bf16','shape':[64,1]},"
	  "{'name':'pkv','kind':'view','base':'pk','shape':[64],'strides':[1]},"
	  "{'name':'nll','kind':'intermediate','dtype':'f32','shape':[64]},"
	  "{'name':'loss','kind':'output','dtype':'f32','shape':[1]}],"
	  "'nodes':[{'op':'logsumexp','inputs':['xr'],'outputs':['lse'],'attrs':{'axis':'last'}},"
	  "{'op':'cast','inputs':['tg'],'outputs':['tf']},"
	  "{'op':'iota','outputs':['row'],'attrs':{'axis':0}},"
	  "{'op':'mul','inputs':['row'],'outputs':['start'],'attrs':{'scalar':1000}},"
	  "{'op':'add','inputs':['start','tf'],'outputs':['at']},"
	  "{'op':'cast','inputs':['at'],'outputs':['idx']},"
	  "{'op':'embedding','inputs':['flat','idx'],'outputs':['pk']},"
	  "{'op':'sub','inputs':['lse','pkv'],'outputs':['nll']},"
	  "{'op':'sum','inputs':['nll'],'outputs':['loss'],'attrs':{'axis':'last'}}]}",
	  -4, 4, 1000, 0 },
	{ "rms_norm's backward as a model's graph gives it: the row sum's kernel takes the rest (the weight's sum apart)",
	  "{'tensors':[{'name':'dy','kind':'input','dtype':'bf16','shape':[96,1024]},"
	  "{'name':'hnb','kind':'input','dtype':'bf16','shape':[96,1024]},"
	  "{'name':'w','kind':'input','dtype':'bf16','shape':[1024]},"
	  "{'name':'h','kind':'input','dtype':'f32','shape':[96,1024]},"
	  "{'name':'r','kind':'input','dtype':'f32','shape':[96,1]},"
	  "{'name':'dres','kind':'input','dtype':'bf16','shape':[96,1024]},"
	  "{'name':'t6','kind':'intermediate','dtype':'bf16','shape':[96,1024]},"
	  "{'name':'t7','kind':'intermediate','dtype':'bf16','shape':[96,1024]},"
	  "{'name':'dw','kind':'output','dtype':'bf16','shape':[1024]},"
	  "{'name':'t9','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'t10','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'dr3','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'dr','kind':'view','base':'dr3','shape':[96],'strides':[1]},"
	  "{'name':'t12','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'p13','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'t14','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'t15','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'t16','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'t17','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'t18','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'t19','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'t20','kind':'intermediate','dtype':'bf16','shape':[96,1024]},"
	  "{'name':'dx','kind':'output','dtype':'bf16','shape':[96,1024]}],"
	  "'nodes':[{'op':'mul','inputs':['dy','hnb'],'outputs':['t6']},"
	  "{'op':'mul','inputs':['dy','w'],'outputs':['t7']},{'op':'cast','inputs':['t7'],'outputs':['t9']},"
	  "{'op':'mul','inputs':['t9','h'],'outputs':['t10']},{'op':'sum','inputs':['t10'],'outputs':['dr']},"
	  "{'op':'sum','inputs':['t6'],'outputs':['dw'],'attrs':{'axis':'leading'}},"
	  "{'op':'mul','inputs':['t9','r'],'outputs':['t12']},"
	  "{'op':'pow','inputs':['r'],'outputs':['p13'],'attrs':{'scalar':3}},"
	  "{'op':'mul','inputs':['dr3'],'outputs':['t14'],'attrs':{'scalar':-0.5}},"
	  "{'op':'mul','inputs':['t14','p13'],'outputs':['t15']},"
	  "{'op':'div','inputs':['t15'],'outputs':['t16'],'attrs':{'scalar':1024}},"
	  "{'op':'mul','inputs':['h'],'outputs':['t17'],'attrs':{'scalar':2}},"
	  "{'op':'mul','inputs':['t16','t17'],'outputs':['t18']},"
	  "{'op':'add','inputs':['t12','t18'],'outputs':['t19']},"
	  "{'op':'cast','inputs':['t19'],'outputs':['t20']},"
	  "{'op':'add','inputs':['t20','dres'],'outputs':['dx']}]}",
	  -2, 2, 0, 2 },
	{ "rms_norm's backward as Llama's compiled graph gives it: the prologue and the epilogue read the input "
	  "through two views of it (the epilogue loads it through the pointer the kernel declared)",
	  "{'tensors':[{'name':'dy','kind':'input','dtype':'bf16','shape':[4,24,1024]},"
	  "{'name':'w','kind':'input','dtype':'f32','shape':[1024]},"
	  "{'name':'h0','kind':'input','dtype':'f32','shape':[4,24,1024]},"
	  "{'name':'ha','kind':'view','base':'h0','shape':[96,1024],'strides':[1024,1],'offset':0},"
	  "{'name':'hb','kind':'view','base':'h0','shape':[96,1024],'strides':[1024,1],'offset':0},"
	  "{'name':'r','kind':'input','dtype':'f32','shape':[96,1]},"
	  "{'name':'dyv','kind':'view','base':'dy','shape':[96,1024],'strides':[1024,1],'offset':0},"
	  "{'name':'t9','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'t10','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'t11','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'dr3','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'dr','kind':'view','base':'dr3','shape':[96],'strides':[1]},"
	  "{'name':'t14','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'t15','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'t16','kind':'intermediate','dtype':'f32','shape':[96,1]},"
	  "{'name':'p17','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'t17','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'t18','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'t19','kind':'intermediate','dtype':'f32','shape':[96,1024]},"
	  "{'name':'dx','kind':'output','dtype':'bf16','shape':[96,1024]}],"
	  "'nodes':[{'op':'cast','inputs':['dyv'],'outputs':['t9']},"
	  "{'op':'mul','inputs':['t9','w'],'outputs':['t10']},"
	  "{'op':'mul','inputs':['t10','ha'],'outputs':['t11']},{'op':'sum','inputs':['t11'],'outputs':['dr']},"
	  "{'op':'mul','inputs':['t10','r'],'outputs':['t19']},"
	  "{'op':'mul','inputs':['dr3'],'outputs':['t14'],'attrs':{'scalar':-0.5}},"
	  "{'op':'mul','inputs':['t14','r'],'outputs':['t15']},"
	  "{'op':'div','inputs':['t15'],'outputs':['t16'],'attrs':{'scalar':1024}},"
	  "{'op':'pow','inputs':['hb'],'outputs':['p17'],'attrs':{'scalar':1}},"
	  "{'op':'mul','inputs':['p17'],'outputs':['t17'],'attrs':{'scalar':2}},"
	  "{'op':'mul','inputs':['t16','t17'],'outputs':['t18']},"
	  "{'op':'add','inputs':['t19','t18'],'outputs':['dx']}]}",
	  -2, 2, 0, 1 },
	{ "reductions' epilogues: a block a row, row values stored and read from memory, an in-place epilogue, "
	  "softmax through logsumexp",
	  "{'tensors':[{'name':'a','kind':'inout','dtype':'f32','shape':[16,3000]},"
	  "{'name':'bias','kind':'input','dtype':'f32','shape':[16,1]},"
	  "{'name':'s','kind':'output','dtype':'f32','shape':[16,1]},"
	  "{'name':'sv','kind':'view','base':'s','shape':[16],'strides':[1]},"
	  "{'name':'t','kind':'output','dtype':'bf16','shape':[16,1]},"
	  "{'name':'b','kind':'input','dtype':'bf16','shape':[40,200]},"
	  "{'name':'lse','kind':'intermediate','dtype':'f32','shape':[40]},"
	  "{'name':'lsec','kind':'view','base':'lse','shape':[40,1],'strides':[1,1]},"
	  "{'name':'d','kind':'intermediate','dtype':'f32','shape':[40,200]},"
	  "{'name':'p','kind':'output','dtype':'bf16','shape':[40,200]}],"
	  "'nodes':[{'op':'sum','inputs':['a'],'outputs':['sv']},"
	  "{'op':'add','inputs':['s','bias'],'outputs':['t']},"
	  "{'op':'mul','inputs':['a','t'],'outputs':['a']},"
	  "{'op':'logsumexp','inputs':['b'],'outputs':['lse']},"
	  "{'op':'sub','inputs':['b','lsec'],'outputs':['d']},{'op':'exp','inputs':['d'],'outputs':['p']}]}",
	  -2, 2, 0, 2 },
	{ "a reduction whose prologue updates its input in place: its consumer runs in a kernel of its own (a second "
	  "pass would read the updated values)",
	  "{'tensors':[{'name':'x','kind':'inout','dtype':'f32','shape':[24,300]},"
	  "{'name':'s','kind':'intermediate','dtype':'f32','shape':[24,1]},"
	  "{'name':'sv','kind':'view','base':'s','shape':[24],'strides':[1]},"
	  "{'name':'y','kind':'output','dtype':'f32','shape':[24,300]}],"
	  "'nodes':[{'op':'mul','inputs':['x'],'outputs':['x'],'attrs':{'scalar':2}},"
	  "{'op':'sum','inputs':['x'],'outputs':['sv']},{'op':'div','inputs':['x','s'],'outputs':['y']}]}",
	  0.5, 2, 0, 2 },
	{ "rotary embeddings as a model writes them (rotate_half: slices, neg, cat): one kernel, the cat recomputed "
	  "where it is read",
	  "{'tensors':[{'name':'qh','kind':'input','dtype':'bf16','shape':[2,64,4,64]},"
	  "{'name':'q','kind':'view','base':'qh','shape':[2,4,64,64],'strides':[16384,64,256,1]},"
	  "{'name':'x1','kind':'view','base':'qh','shape':[2,4,64,32],'strides':[16384,64,256,1]},"
	  "{'name':'x2','kind':'view','base':'qh','shape':[2,4,64,32],'strides':[16384,64,256,1],'offset':32},"
	  "{'name':'cos','kind':'input','dtype':'bf16','shape':[64,64]},"
	  "{'name':'sin','kind':'input','dtype':'bf16','shape':[64,64]},"
	  "{'name':'t1','kind':'intermediate','dtype':'bf16','shape':[2,4,64,64]},"
	  "{'name':'n','kind':'intermediate','dtype':'bf16','shape':[2,4,64,32]},"
	  "{'name':'rot','kind':'intermediate','dtype':'bf16','shape':[2,4,64,64]},"
	  "{'name':'rota','kind':'view','base':'rot','shape':[2,4,64,32],'strides':[16384,4096,64,1]},"
	  "{'name':'rotb','kind':'view','base':'rot','shape':[2,4,64,32],'strides':[16384,4096,64,1],'offset':32},"
	  "{'name':'t2','kind':'intermediate','dtype':'bf16','shape':[2,4,64,64]},"
	  "{'name':'qr','kind':'output','dtype':'bf16','shape':[2,4,64,64]}],"
	  "'nodes':[{'op':'mul','inputs':['q','cos'],'outputs':['t1']},"
	  "{'op':'neg','inputs':['x2'],'outputs':['n']},"
	  "{'op':'cast','inputs':['n'],'outputs':['rota']},{'op':'cast','inputs':['x1'],'outputs':['rotb']},"
	  "{'op':'mul','inputs':['rot','sin'],'outputs':['t2']},{'op':'add','inputs':['t1','t2'],'outputs':['qr']}]}",
	  -2, 2, 0, 1 },
	{ "their backward (slice backward into zeros, neg, adds): one kernel",
	  "{'tensors':[{'name':'g','kind':'input','dtype':'bf16','shape':[2,4,64,64]},"
	  "{'name':'cos','kind':'input','dtype':'bf16','shape':[64,64]},"
	  "{'name':'sin','kind':'input','dtype':'bf16','shape':[64,64]},"
	  "{'name':'mb0','kind':'intermediate','dtype':'bf16','shape':[2,4,64,64]},"
	  "{'name':'mb1','kind':'intermediate','dtype':'bf16','shape':[2,4,64,64]},"
	  "{'name':'sb1','kind':'view','base':'mb1','shape':[2,4,64,32],'strides':[16384,4096,64,1]},"
	  "{'name':'sb2','kind':'view','base':'mb1','shape':[2,4,64,32],'strides':[16384,4096,64,1],'offset':32},"
	  "{'name':'nb','kind':'intermediate','dtype':'bf16','shape':[2,4,64,32]},"
	  "{'name':'z2','kind':'intermediate','dtype':'bf16','shape':[2,4,64,64]},"
	  "{'name':'z2b','kind':'view','base':'z2','shape':[2,4,64,32],'strides':[16384,4096,64,1],'offset':32},"
	  "{'name':'z1','kind':'intermediate','dtype':'bf16','shape':[2,4,64,64]},"
	  "{'name':'z1a','kind':'view','base':'z1','shape':[2,4,64,32],'strides':[16384,4096,64,1]},"
	  "{'name':'a1','kind':'intermediate','dtype':'bf16','shape':[2,4,64,64]},"
	  "{'name':'dq','kind':'output','dtype':'bf16','shape':[2,4,64,64]}],"
	  "'nodes':[{'op':'mul','inputs':['g','cos'],'outputs':['mb0']},{'op':'mul','inputs':['g','sin'],'outputs':['mb1']},"
	  "{'op':'neg','inputs':['sb1'],'outputs':['nb']},"
	  "{'op':'fill','outputs':['z2'],'attrs':{'scalar':0}},{'op':'cast','inputs':['nb'],'outputs':['z2b']},"
	  "{'op':'fill','outputs':['z1'],'attrs':{'scalar':0}},{'op':'cast','inputs':['sb2'],'outputs':['z1a']},"
	  "{'op':'add','inputs':['mb0','z2'],'outputs':['a1']},{'op':'add','inputs':['a1','z1'],'outputs':['dq']}]}",
	  -2, 2, 0, 1 },
	{ "rotary embeddings as torch 2.11 gives them (Llama's compiled forward): the halves read from the projection in "
	  "[B,S,H,D] order, neg written to a storage of its own in that order: one kernel, the neg recomputed where the "
	  "cat reads it",
	  "{'tensors':[{'name':'qh','kind':'input','dtype':'bf16','shape':[80,128]},"
	  "{'name':'q','kind':'view','base':'qh','shape':[2,4,40,32],'strides':[5120,32,128,1]},"
	  "{'name':'x1','kind':'view','base':'qh','shape':[2,4,40,16],'strides':[5120,32,128,1]},"
	  "{'name':'x2','kind':'view','base':'qh','shape':[2,4,40,16],'strides':[5120,32,128,1],'offset':16},"
	  "{'name':'cos','kind':'input','dtype':'bf16','shape':[40,32]},"
	  "{'name':'sin','kind':'input','dtype':'bf16','shape':[40,32]},"
	  "{'name':'s54','kind':'intermediate','dtype':'bf16','shape':[10240]},"
	  "{'name':'v55','kind':'view','base':'s54','shape':[2,4,40,32],'strides':[5120,32,128,1]},"
	  "{'name':'s58','kind':'intermediate','dtype':'bf16','shape':[5120]},"
	  "{'name':'v59','kind':'view','base':'s58','shape':[2,4,40,16],'strides':[2560,16,64,1]},"
	  "{'name':'t60','kind':'intermediate','dtype':'bf16','shape':[2,4,40,32]},"
	  "{'name':'w61','kind':'view','base':'t60','shape':[2,4,40,16],'strides':[5120,1280,32,1]},"
	  "{'name':'w62','kind':'view','base':'t60','shape':[2,4,40,16],'strides':[5120,1280,32,1],'offset':16},"
	  "{'name':'t64','kind':'intermediate','dtype':'bf16','shape':[2,4,40,32]},"
	  "{'name':'s65','kind':'output','dtype':'bf16','shape':[10240]},"
	  "{'name':'v66','kind':'view','base':'s65','shape':[2,4,40,32],'strides':[5120,32,128,1]}],"
	  "'nodes':[{'op':'mul','inputs':['q','cos'],'outputs':['v55']},"
	  "{'op':'neg','inputs':['x2'],'outputs':['v59']},"
	  "{'op':'cast','inputs':['v59'],'outputs':['w61']},{'op':'cast','inputs':['x1'],'outputs':['w62']},"
	  "{'op':'mul','inputs':['t60','sin'],'outputs':['t64']},{'op':'add','inputs':['v55','t64'],'outputs':['v66']}]}",
	  -2, 2, 0, 1 },
	{ "their backward as torch 2.11 gives it (Llama's k: the gradient in [B,S,H,D] order, the halves' slice "
	  "backwards into zeros added as [rows, D], then cast to [B,S,H,D] for the GEMM): one kernel, the cast's",
	  "{'tensors':[{'name':'s218','kind':'input','dtype':'bf16','shape':[4608]},"
	  "{'name':'v219','kind':'view','base':'s218','shape':[2,3,48,16],'strides':[2304,16,48,1]},"
	  "{'name':'sin','kind':'input','dtype':'bf16','shape':[48,16]},"
	  "{'name':'cos','kind':'input','dtype':'bf16','shape':[48,16]},"
	  "{'name':'s223','kind':'intermediate','dtype':'bf16','shape':[4608]},"
	  "{'name':'v224','kind':'view','base':'s223','shape':[2,3,48,16],'strides':[2304,16,48,1]},"
	  "{'name':'v225','kind':'view','base':'s223','shape':[2,3,48,8],'strides':[2304,16,48,1]},"
	  "{'name':'v226','kind':'view','base':'s223','shape':[2,3,48,8],'strides':[2304,16,48,1],'offset':8},"
	  "{'name':'s227','kind':'intermediate','dtype':'bf16','shape':[2304]},"
	  "{'name':'v228','kind':'view','base':'s227','shape':[2,3,48,8],'strides':[1152,8,24,1]},"
	  "{'name':'t229','kind':'intermediate','dtype':'bf16','shape':[2,3,48,16]},"
	  "{'name':'w230','kind':'view','base':'t229','shape':[2,3,48,8],'strides':[2304,768,16,1],'offset':8},"
	  "{'name':'w233','kind':'view','base':'t229','shape':[288,16],'strides':[16,1]},"
	  "{'name':'t231','kind':'intermediate','dtype':'bf16','shape':[2,3,48,16]},"
	  "{'name':'w232','kind':'view','base':'t231','shape':[2,3,48,8],'strides':[2304,768,16,1]},"
	  "{'name':'w234','kind':'view','base':'t231','shape':[288,16],'strides':[16,1]},"
	  "{'name':'t235','kind':'intermediate','dtype':'bf16','shape':[2,3,48,16]},"
	  "{'name':'w236','kind':'view','base':'t235','shape':[288,16],'strides':[16,1]},"
	  "{'name':'s238','kind':'intermediate','dtype':'bf16','shape':[4608]},"
	  "{'name':'v239','kind':'view','base':'s238','shape':[2,3,48,16],'strides':[2304,16,48,1]},"
	  "{'name':'t240','kind':'intermediate','dtype':'bf16','shape':[2,3,48,16]},"
	  "{'name':'v270','kind':'view','base':'t240','shape':[2,48,3,16],'strides':[2304,16,768,1]},"
	  "{'name':'t271','kind':'output','dtype':'bf16','shape':[2,48,3,16]}],"
	  "'nodes':[{'op':'mul','inputs':['v219','sin'],'outputs':['v224']},"
	  "{'op':'neg','inputs':['v225'],'outputs':['v228']},"
	  "{'op':'fill','outputs':['t229'],'attrs':{'scalar':0}},{'op':'cast','inputs':['v228'],'outputs':['w230']},"
	  "{'op':'fill','outputs':['t231'],'attrs':{'scalar':0}},{'op':'cast','inputs':['v226'],'outputs':['w232']},"
	  "{'op':'add','inputs':['w233','w234'],'outputs':['w236']},"
	  "{'op':'mul','inputs':['v219','cos'],'outputs':['v239']},{'op':'add','inputs':['t235','v239'],'outputs':['t240']},"
	  "{'op':'cast','inputs':['v270'],'outputs':['t271']}]}",
	  -2, 2, 0, 1 },
	{ "a bias added to a projection, then split into heads by a transposing cast (TransformerEncoder's compiled "
	  "forward): one kernel, the sum recomputed where the cast reads it",
	  "{'tensors':[{'name':'g','kind':'input','dtype':'bf16','shape':[80,96]},"
	  "{'name':'bias','kind':'input','dtype':'bf16','shape':[96]},"
	  "{'name':'t27','kind':'intermediate','dtype':'bf16','shape':[40,2,96]},"
	  "{'name':'w28','kind':'view','base':'t27','shape':[80,96],'strides':[96,1]},"
	  "{'name':'v32','kind':'view','base':'t27','shape':[3,40,2,32],'strides':[32,192,96,1]},"
	  "{'name':'t33','kind':'output','dtype':'bf16','shape':[3,40,2,32]}],"
	  "'nodes':[{'op':'add','inputs':['g','bias'],'outputs':['w28']},{'op':'cast','inputs':['v32'],'outputs':['t33']}]}",
	  -2, 2, 0, 1 },
	{ "a product written transposed, exponentiated and normalized by its rows' sums: recomputed in both passes of "
	  "the reduction's kernel (its prologue, and the prologue again where the epilogue reads it)",
	  "{'tensors':[{'name':'a','kind':'input','dtype':'f32','shape':[48,80]},"
	  "{'name':'b','kind':'input','dtype':'f32','shape':[48,80]},"
	  "{'name':'t','kind':'intermediate','dtype':'f32','shape':[80,48]},"
	  "{'name':'tt','kind':'view','base':'t','shape':[48,80],'strides':[1,48]},"
	  "{'name':'e','kind':'intermediate','dtype':'f32','shape':[80,48]},"
	  "{'name':'s','kind':'intermediate','dtype':'f32','shape':[80,1]},"
	  "{'name':'sv','kind':'view','base':'s','shape':[80],'strides':[1]},"
	  "{'name':'y','kind':'output','dtype':'f32','shape':[80,48]}],"
	  "'nodes':[{'op':'mul','inputs':['a','b'],'outputs':['tt']},{'op':'exp','inputs':['t'],'outputs':['e']},"
	  "{'op':'sum','inputs':['e'],'outputs':['sv']},{'op':'div','inputs':['e','s'],'outputs':['y']}]}",
	  -1, 1, 0, 1 },
	{ "a cat whose part's source is updated in place before it is read: not recomputed (it reads the old values)",
	  "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[40,16]},"
	  "{'name':'pa','kind':'view','base':'p','shape':[40,8],'strides':[16,1]},"
	  "{'name':'pb','kind':'view','base':'p','shape':[40,8],'strides':[16,1],'offset':8},"
	  "{'name':'c','kind':'intermediate','dtype':'f32','shape':[40,16]},"
	  "{'name':'ca','kind':'view','base':'c','shape':[40,8],'strides':[16,1]},"
	  "{'name':'cb','kind':'view','base':'c','shape':[40,8],'strides':[16,1],'offset':8},"
	  "{'name':'y','kind':'output','dtype':'f32','shape':[40,16]}],"
	  "'nodes':[{'op':'neg','inputs':['pb'],'outputs':['ca']},{'op':'cast','inputs':['pa'],'outputs':['cb']},"
	  "{'op':'mul','inputs':['p'],'outputs':['p'],'attrs':{'scalar':3}},"
	  "{'op':'add','inputs':['c','p'],'outputs':['y']}]}",
	  -2, 2, 0, 0 },
	{ "SwiGLU as a model writes it: silu(x W1) waits for x W3 and takes the product (one kernel between the GEMMs)",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[64,96]},"
	  "{'name':'w1','kind':'input','dtype':'bf16','shape':[96,160]},"
	  "{'name':'w3','kind':'input','dtype':'bf16','shape':[96,160]},"
	  "{'name':'w2','kind':'input','dtype':'bf16','shape':[160,96]},"
	  "{'name':'h1','kind':'intermediate','dtype':'bf16','shape':[64,160]},"
	  "{'name':'s','kind':'intermediate','dtype':'bf16','shape':[64,160]},"
	  "{'name':'h3','kind':'intermediate','dtype':'bf16','shape':[64,160]},"
	  "{'name':'m','kind':'intermediate','dtype':'bf16','shape':[64,160]},"
	  "{'name':'y','kind':'output','dtype':'bf16','shape':[64,96]}],"
	  "'nodes':[{'op':'gemm','inputs':{'a':'x','b':'w1'},'outputs':{'d':'h1'}},"
	  "{'op':'silu','inputs':['h1'],'outputs':['s']},"
	  "{'op':'gemm','inputs':{'a':'x','b':'w3'},'outputs':{'d':'h3'}},"
	  "{'op':'mul','inputs':['s','h3'],'outputs':['m']},"
	  "{'op':'gemm','inputs':{'a':'m','b':'w2'},'outputs':{'d':'y'}}]}",
	  -1, 1, 0, 4 },
	{ "SwiGLU's backward: silu's backward joins the gradient's products ahead of the weights' GEMMs",
	  "{'tensors':[{'name':'dy','kind':'input','dtype':'bf16','shape':[64,96]},"
	  "{'name':'xt','kind':'input','dtype':'bf16','shape':[96,64]},"
	  "{'name':'w2t','kind':'input','dtype':'bf16','shape':[96,160]},"
	  "{'name':'w1t','kind':'input','dtype':'bf16','shape':[160,96]},"
	  "{'name':'w3t','kind':'input','dtype':'bf16','shape':[160,96]},"
	  "{'name':'h1','kind':'input','dtype':'bf16','shape':[64,160]},"
	  "{'name':'h3','kind':'input','dtype':'bf16','shape':[64,160]},"
	  "{'name':'s','kind':'input','dtype':'bf16','shape':[64,160]},"
	  "{'name':'dm','kind':'intermediate','dtype':'bf16','shape':[64,160]},"
	  "{'name':'ds','kind':'intermediate','dtype':'bf16','shape':[64,160]},"
	  "{'name':'dh3','kind':'intermediate','dtype':'bf16','shape':[64,160]},"
	  "{'name':'dh1','kind':'intermediate','dtype':'bf16','shape':[64,160]},"
	  "{'name':'dx3','kind':'intermediate','dtype':'bf16','shape':[64,96]},"
	  "{'name':'dx1','kind':'intermediate','dtype':'bf16','shape':[64,96]},"
	  "{'name':'dw3','kind':'output','dtype':'bf16','shape':[96,160]},"
	  "{'name':'dw1','kind':'output','dtype':'bf16','shape':[96,160]},"
	  "{'name':'dx','kind':'output','dtype':'bf16','shape':[64,96]}],"
	  "'nodes':[{'op':'gemm','inputs':{'a':'dy','b':'w2t'},'outputs':{'d':'dm'}},"
	  "{'op':'mul','inputs':['dm','h3'],'outputs':['ds']},{'op':'mul','inputs':['dm','s'],'outputs':['dh3']},"
	  "{'op':'gemm','inputs':{'a':'xt','b':'dh3'},'outputs':{'d':'dw3'}},"
	  "{'op':'gemm','inputs':{'a':'dh3','b':'w3t'},'outputs':{'d':'dx3'}},"
	  "{'op':'silu_backward','inputs':['ds','h1'],'outputs':['dh1']},"
	  "{'op':'gemm','inputs':{'a':'xt','b':'dh1'},'outputs':{'d':'dw1'}},"
	  "{'op':'gemm','inputs':{'a':'dh1','b':'w1t'},'outputs':{'d':'dx1'}},"
	  "{'op':'add','inputs':['dx1','dx3'],'outputs':['dx']}]}",
	  -1, 1, 0, 7 },
	{ "attention's input gradients as Llama's compiled backward sums them: dx_v + dx_k waits past the GEMM of the "
	  "transposed dq (a kernel of the same size, independent of the sum, runs first) and takes + dx_q",
	  "{'tensors':[{'name':'dv','kind':'input','dtype':'bf16','shape':[64,32]},"
	  "{'name':'wv','kind':'input','dtype':'bf16','shape':[32,96]},"
	  "{'name':'dk','kind':'input','dtype':'bf16','shape':[64,32]},"
	  "{'name':'wk','kind':'input','dtype':'bf16','shape':[32,96]},"
	  "{'name':'dq','kind':'input','dtype':'bf16','shape':[2,4,32,24]},"
	  "{'name':'dqt','kind':'view','base':'dq','shape':[2,32,4,24],'strides':[3072,24,768,1]},"
	  "{'name':'wq','kind':'input','dtype':'bf16','shape':[96,96]},"
	  "{'name':'xv','kind':'intermediate','dtype':'bf16','shape':[64,96]},"
	  "{'name':'xk','kind':'intermediate','dtype':'bf16','shape':[64,96]},"
	  "{'name':'s1','kind':'intermediate','dtype':'bf16','shape':[64,96]},"
	  "{'name':'q2','kind':'intermediate','dtype':'bf16','shape':[2,32,4,24]},"
	  "{'name':'q2v','kind':'view','base':'q2','shape':[64,96],'strides':[96,1]},"
	  "{'name':'xq','kind':'intermediate','dtype':'bf16','shape':[64,96]},"
	  "{'name':'dx','kind':'output','dtype':'bf16','shape':[64,96]}],"
	  "'nodes':[{'op':'gemm','inputs':{'a':'dv','b':'wv'},'outputs':{'d':'xv'}},"
	  "{'op':'gemm','inputs':{'a':'dk','b':'wk'},'outputs':{'d':'xk'}},"
	  "{'op':'add','inputs':['xv','xk'],'outputs':['s1']},"
	  "{'op':'cast','inputs':['dqt'],'outputs':['q2']},"
	  "{'op':'gemm','inputs':{'a':'q2v','b':'wq'},'outputs':{'d':'xq'}},"
	  "{'op':'add','inputs':['s1','xq'],'outputs':['dx']}]}",
	  -1, 1, 0, 5 },
};

const size_t tl_prog_ncases = sizeof(tl_prog_cases) / sizeof(tl_prog_cases[0]);

/* ---- elements of every dtype ---------------------------------------------- */

static double half_bits_to_double(uint16_t h)
{
	int s = h >> 15, e = (h >> 10) & 0x1f, f = h & 0x3ff;
	double v = e == 0 ? ldexp((double)f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexp((double)(f | 0x400), e - 25);

	return s ? -v : v;
}

static double load_elem(enum rp_dtype dt, const void *base, size_t i)
{
	const char *p = (const char *)base + i * rp_dtype_size(dt);
	float f;
	double d;
	uint16_t h;
	uint32_t u;
	int32_t i32;
	int64_t i64;

	switch (dt) {
	case RP_DTYPE_F32:
		memcpy(&f, p, 4);
		return f;
	case RP_DTYPE_F64:
		memcpy(&d, p, 8);
		return d;
	case RP_DTYPE_F16:
		memcpy(&h, p, 2);
		return half_bits_to_double(h);
	case RP_DTYPE_BF16:
		memcpy(&h, p, 2);
		u = (uint32_t)h << 16;
		memcpy(&f, &u, 4);
		return f;
	case RP_DTYPE_I32:
		memcpy(&i32, p, 4);
		return i32;
	case RP_DTYPE_I64:
		memcpy(&i64, p, 8);
		return (double)i64;
	default:
		return *(const unsigned char *)p;
	}
}

/* v must be exact in dt: a multiple of 1/64 under 256 in magnitude is in
 * every float dtype, an integer in every integer one. */
static void store_exact(enum rp_dtype dt, void *base, size_t i, double v)
{
	char *p = (char *)base + i * rp_dtype_size(dt);
	float f = (float)v;
	uint32_t u;
	uint16_t h;
	int32_t i32 = (int32_t)v;
	int64_t i64 = (int64_t)v;
	unsigned char u8 = (unsigned char)v;

	memcpy(&u, &f, 4);
	switch (dt) {
	case RP_DTYPE_F32:
		memcpy(p, &f, 4);
		break;
	case RP_DTYPE_F64:
		memcpy(p, &v, 8);
		break;
	case RP_DTYPE_BF16:
		h = (uint16_t)(u >> 16);
		memcpy(p, &h, 2);
		break;
	case RP_DTYPE_F16:
		h = (uint16_t)((u >> 16) & 0x8000);
		if (f != 0)
			h |= (uint16_t)(((((u >> 23) & 0xff) - 127 + 15) << 10) | ((u >> 13) & 0x3ff));
		memcpy(p, &h, 2);
		break;
	case RP_DTYPE_I32:
		memcpy(p, &i32, 4);
		break;
	case RP_DTYPE_I64:
		memcpy(p, &i64, 8);
		break;
	default:
		memcpy(p, &u8, 1);
		break;
	}
}

static void fill_random(struct tl_rng *rng, enum rp_dtype dt, void *base, size_t n, double lo, double hi)
{
	for (size_t i = 0; i < n; i++) {
		if (rp_dtype_is_float(dt))
			store_exact(dt, base, i, (double)tl_rng_int(rng, (int64_t)ceil(lo * 64), (int64_t)ceil(hi * 64) - 1) / 64);
		else
			store_exact(dt, base, i, (double)tl_rng_int(rng, (int64_t)lo, (int64_t)hi - 1));
	}
}

/* Outputs start as a pattern no result of these programs has: a NaN of
 * our own for floats, 0xa5 bytes for integers. */
static const unsigned char poison_bytes[RP_DTYPE_COUNT][8] = {
	[RP_DTYPE_F32] = { 0xad, 0xde, 0xc1, 0x7f },
	[RP_DTYPE_F16] = { 0xad, 0x7d },
	[RP_DTYPE_BF16] = { 0xad, 0x7f },
	[RP_DTYPE_F64] = { 0xad, 0x0b, 0xed, 0x5e, 0xad, 0xde, 0xf4, 0x7f },
	[RP_DTYPE_I32] = { 0xa5, 0xa5, 0xa5, 0xa5 },
	[RP_DTYPE_I64] = { 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5 },
	[RP_DTYPE_U8] = { 0xa5 },
	[RP_DTYPE_E4M3] = { 0xff },
	[RP_DTYPE_E5M2] = { 0xff },
};

static void poison(enum rp_dtype dt, void *base, size_t count)
{
	size_t e = rp_dtype_size(dt);

	for (size_t i = 0; i < count; i++)
		memcpy((char *)base + i * e, poison_bytes[dt], e);
}

static bool is_poison(enum rp_dtype dt, const void *base, size_t i)
{
	size_t e = rp_dtype_size(dt);

	return memcmp((const char *)base + i * e, poison_bytes[dt], e) == 0;
}

/* Relative to the tensor's norm: a few roundings of its dtype; f32's
 * allows for long sums accumulated in f32. */
static double tolerance(enum rp_dtype dt)
{
	switch (dt) {
	case RP_DTYPE_BF16:
		return 1e-2;
	case RP_DTYPE_F16:
		return 2e-3;
	case RP_DTYPE_F32:
		return 1e-4;
	case RP_DTYPE_F64:
		return 1e-10;
	default:
		return 0;
	}
}

/* ---- programs -------------------------------------------------------------- */

static cJSON *json(const char *text)
{
	char *s = strdup(text);
	cJSON *j;

	if (!s)
		return NULL;
	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	j = cJSON_Parse(s);
	free(s);
	return j;
}

static const char *message_of(const struct rp_error *err)
{
	const char *m = err->params ? cJSON_GetStringValue(cJSON_GetObjectItem(err->params, "message")) : NULL;

	return m ? m : err->name ? err->name : "?";
}

bool tl_prog_is_result(const struct tl_prog *t, int r)
{
	const struct rp_prog_tensor *x = &t->p.tensors[r];

	return x->root == r && (x->kind == RP_PT_OUTPUT || x->kind == RP_PT_INOUT);
}

int tl_prog_case_read(struct tl_prog_case *c, const char *path)
{
	FILE *f = fopen(path, "r"), *m;
	char *text = NULL, buf[65536];
	size_t len = 0, n;

	if (!f)
		return -errno;
	if (!(m = open_memstream(&text, &len))) {
		fclose(f);
		return -ENOMEM;
	}
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, m);
	int r = ferror(f) ? -EIO : 0;
	fclose(f);
	if (fclose(m) || !text)
		r = -ENOMEM;
	char *name = r ? NULL : strdup(path);
	if (!r && !name)
		r = -ENOMEM;
	if (r) {
		free(text);
		return r;
	}
	*c = (struct tl_prog_case){ .name = name, .json = text, .lo = -1, .hi = 1, .inherited = true };
	return 0;
}

void tl_prog_case_free(struct tl_prog_case *c)
{
	free((char *)c->name);
	free((char *)c->json);
	*c = (struct tl_prog_case){ 0 };
}

/* upstream_tolerance[], node by node in the program's order: what a node
 * writes takes the largest of what it reads and, for a half-precision
 * tensor it writes, that dtype's tolerance. */
static void mark_upstream(struct tl_prog *t)
{
	const struct rp_program *p = &t->p;

	for (int i = 0; i < p->nnodes; i++) {
		const struct rp_prog_node *n = &p->nodes[i];
		bool compute = n->op->cls == RP_PC_COMPUTE;
		int writes[RP_PROG_NODE_IN_MAX + RP_PROG_NODE_OUT_MAX], nw = 0;
		double up = 0;

		for (int k = 0; k < n->nin; k++) {
			if (n->in[k] < 0)
				continue;
			if (compute && n->compute.spec->operands[k].role == RP_ROLE_OUT)
				writes[nw++] = n->in[k];
			else
				up = fmax(up, t->upstream_tolerance[p->tensors[n->in[k]].root]);
		}
		for (int k = 0; k < n->nout; k++)
			if (n->out[k] >= 0)
				writes[nw++] = n->out[k];
		for (int k = 0; k < nw; k++) {
			const struct rp_prog_tensor *x = &p->tensors[writes[k]];
			double own = x->dtype == RP_DTYPE_BF16 || x->dtype == RP_DTYPE_F16 ? tolerance(x->dtype) : 0;
			double *u = &t->upstream_tolerance[x->root];
			*u = fmax(*u, fmax(up, own));
		}
	}
}

int tl_prog_open(struct tl_prog *t, const struct tl_prog_case *c, uint64_t salt, char *why, size_t why_size)
{
	struct rp_error err = { 0 };
	cJSON *params = json(c->json);
	struct tl_rng rng;
	int n;

	memset(t, 0, sizeof(*t));
	if (!params || rp_program_parse(params, &t->p, &err) < 0) {
		snprintf(why, why_size, "the program is refused: %s", message_of(&err));
		rp_error_clear(&err);
		cJSON_Delete(params);
		return -1;
	}
	cJSON_Delete(params);
	if (rd_prog_plan_build(&t->p, &t->plan, &err) < 0) {
		snprintf(why, why_size, "no plan: %s", message_of(&err));
		rp_error_clear(&err);
		return -1;
	}
	n = t->p.ntensors;
	t->root_bytes = calloc((size_t)n, sizeof(size_t));
	t->initial = calloc((size_t)n, sizeof(void *));
	t->ref = calloc((size_t)n, sizeof(void *));
	t->scalars = calloc((size_t)t->p.nbound + 1, sizeof(double));
	t->upstream_tolerance = calloc((size_t)n, sizeof(double));
	if (c->inherited)
		mark_upstream(t);
	for (int i = 0; i < n; i++) {
		int root = t->p.tensors[i].root;
		if (t->p.tensors[i].extent_bytes > t->root_bytes[root])
			t->root_bytes[root] = t->p.tensors[i].extent_bytes;
	}
	tl_rng_init(&rng, salt);
	for (int i = 0; i < n; i++) {
		const struct rp_prog_tensor *x = &t->p.tensors[i];
		size_t bytes = t->root_bytes[i] ? t->root_bytes[i] : 8, count = bytes / rp_dtype_size(x->dtype);
		if (x->root != i)
			continue;
		if (x->kind == RP_PT_SCALAR) {
			/* An optimizer's step counts from 1; a dropout seed is an
			 * integer below 2^53; the others (lr) are small. */
			if (strcmp(x->name, "step") == 0)
				t->scalars[x->bind_index] = 3;
			else if (x->seed)
				t->scalars[x->bind_index] = (double)(tl_rng_next(&rng) >> 11);
			else
				t->scalars[x->bind_index] = (double)tl_rng_int(&rng, 6, 64) / 64;
			continue;
		}
		t->ref[i] = malloc(bytes);
		if (x->kind == RP_PT_INTERMEDIATE)
			continue;
		t->initial[i] = malloc(bytes);
		if (x->kind == RP_PT_OUTPUT)
			poison(x->dtype, t->initial[i], count);
		else if (rp_dtype_is_float(x->dtype))
			fill_random(&rng, x->dtype, t->initial[i], count, c->lo, c->hi);
		else
			fill_random(&rng, x->dtype, t->initial[i], count, 0, (double)(c->int_hi ? c->int_hi : 16));
	}
	return 0;
}

void tl_prog_close(struct tl_prog *t)
{
	for (int i = 0; i < t->p.ntensors && t->ref; i++) {
		free(t->initial[i]);
		free(t->ref[i]);
	}
	free(t->root_bytes);
	free(t->initial);
	free(t->ref);
	free(t->scalars);
	free(t->upstream_tolerance);
	rd_prog_plan_finish(&t->plan);
	rp_program_finish(&t->p);
}

int tl_prog_reference(struct tl_prog *t)
{
	void **addr = calloc((size_t)t->p.ntensors, sizeof(void *));
	size_t ws = 0;
	void *workspace;
	int r = 0;

	if (!addr)
		return -ENOMEM;
	for (int i = 0; i < t->p.ntensors; i++)
		if (t->p.tensors[i].root == i && t->initial[i])
			memcpy(t->ref[i], t->initial[i], t->root_bytes[i]);
	for (int i = 0; i < t->p.ntensors; i++) {
		const struct rp_prog_tensor *x = &t->p.tensors[i], *root = &t->p.tensors[x->root];
		char *base = root->kind == RP_PT_SCALAR ? (char *)&t->scalars[root->bind_index] : t->ref[x->root];
		addr[i] = base + (size_t)x->root_offset * rp_dtype_size(x->dtype);
	}
	for (int i = 0; i < t->p.nnodes; i++) {
		size_t w = rd_host_node_workspace(&t->p, i);
		ws = w > ws ? w : ws;
	}
	workspace = malloc(ws ? ws : 1);
	for (int i = 0; i < t->p.nnodes && r == 0; i++)
		r = rd_host_node_run(&t->p, i, addr, workspace, ws);
	free(workspace);
	free(addr);
	return r;
}

int tl_prog_run_library(const struct tl_prog *t, int s, void *const *bound, void *arena)
{
	const struct rd_prog_step *st = &t->plan.steps[s];
	void **addr = calloc((size_t)t->p.ntensors, sizeof(void *));
	size_t ws = rd_host_node_workspace(&t->p, st->first_node);
	void *workspace = malloc(ws ? ws : 1);
	int r = -ENOMEM;

	if (addr && workspace) {
		for (int i = 0; i < t->p.ntensors; i++) {
			const struct rp_prog_tensor *x = &t->p.tensors[i];
			addr[i] = x->kind == RP_PT_SCALAR ? &t->scalars[x->bind_index]
							 : rd_prog_tensor_address(&t->plan, &t->p, i, bound, arena);
		}
		r = rd_host_node_run(&t->p, st->first_node, addr, workspace, ws);
	}
	free(addr);
	free(workspace);
	return r;
}

bool tl_prog_compare(const struct tl_prog *t, int r, const void *got, char *msg, size_t msg_size)
{
	const struct rp_prog_tensor *x = &t->p.tensors[r];
	size_t count = t->root_bytes[r] / rp_dtype_size(x->dtype);
	unsigned long special = 0, untouched = 0, integers = 0;
	double num = 0, den = 0;

	for (size_t i = 0; i < count; i++) {
		double g = load_elem(x->dtype, got, i), w = load_elem(x->dtype, t->ref[r], i);
		if (is_poison(x->dtype, t->ref[r], i) != is_poison(x->dtype, got, i)) {
			untouched++;
		} else if (isnan(w) || isnan(g) || isinf(w) || isinf(g)) {
			special += !(isnan(w) && isnan(g)) && w != g;
		} else if (!rp_dtype_is_float(x->dtype)) {
			integers += g != w;
		} else {
			num += (g - w) * (g - w);
			den += w * w;
		}
	}
	double rel = den > 0 ? sqrt(num / den) : sqrt(num);
	double tol = fmax(tolerance(x->dtype), t->upstream_tolerance[r]);
	bool ok = rel <= tol && !special && !untouched && !integers;
	snprintf(msg, msg_size,
		 "%s (%s, %zu elements): relative error %.3g (tolerance %.3g), %lu NaN or infinities not the reference's, "
		 "%lu elements written that should not be or not written that should, %lu integers wrong",
		 x->name, rp_dtype_name(x->dtype), count, rel, tol, special, untouched, integers);
	return ok;
}
